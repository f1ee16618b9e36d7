// Builds the chat page into dist/: one minified script and one stylesheet, each named by a hash
// of its content (so the server can let browsers cache them for good), the page that loads them,
// and the bundled libraries' licences. The output depends only on the sources and the locked
// packages, so CI rebuilds it and compares it with what is committed.

import { build } from "esbuild";
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";

const dist = new URL("./dist/", import.meta.url);
const src = (f) => new URL(`./src/${f}`, import.meta.url);
const hash = (bytes) => createHash("sha256").update(bytes).digest("hex").slice(0, 12);

async function bundle(entry) {
  const r = await build({
    entryPoints: [entry],
    bundle: true,
    minify: true,
    format: "iife",
    target: ["es2022", "chrome110", "firefox110", "safari16"],
    legalComments: "none",
    write: false,
    logLevel: "warning",
  });
  return r.outputFiles[0].contents;
}

const js = await bundle(src("main.js").pathname);
const css = await bundle(src("style.css").pathname);

const licenses = [
  ["marked", "LICENSE.md"],
  ["dompurify", "LICENSE"],
]
  .map(([pkg, file]) => {
    const meta = JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url)));
    const text = readFileSync(new URL(`./node_modules/${pkg}/${file}`, import.meta.url), "utf8");
    return `${pkg} ${meta.version} (${meta.license})\n${"=".repeat(72)}\n\n${text.trim()}\n`;
  })
  .join("\n\n");
const notice = Buffer.from(
  `The onebit-pipe chat page bundles these libraries; their licences follow.\n\n${licenses}`,
);

const names = {
  js: `app.${hash(js)}.js`,
  css: `app.${hash(css)}.css`,
  licenses: `licenses.${hash(notice)}.txt`,
};
const page = readFileSync(src("index.html"), "utf8").replace(/\{\{(\w+)\}\}/g, (_, k) => names[k]);

rmSync(dist, { recursive: true, force: true });
mkdirSync(dist);
writeFileSync(new URL(names.js, dist), js);
writeFileSync(new URL(names.css, dist), css);
writeFileSync(new URL(names.licenses, dist), notice);
writeFileSync(new URL("index.html", dist), page);
for (const f of readdirSync(dist).sort()) {
  console.log(`dist/${f}  ${readFileSync(new URL(f, dist)).length} bytes`);
}
