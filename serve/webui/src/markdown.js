// Model text to safe HTML. The model's text is untrusted: markdown is rendered by `marked`, with
// raw HTML written out as text, images as their markdown source (nothing loads), and links kept
// only for http(s) and mailto; then DOMPurify sanitizes the result, so nothing the model writes
// can run script or make a request.

import { Marked } from "marked";
import DOMPurify from "dompurify";

const SAFE_URL = /^(?:https?:|mailto:)/i;

/** `s` with HTML's special characters escaped. */
export function escapeHtml(s) {
  return String(s)
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;")
    .replaceAll("'", "&#39;");
}

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    html(token) {
      return escapeHtml(token.raw ?? token.text ?? "");
    },
    image(token) {
      return escapeHtml(token.raw ?? "");
    },
    link(token) {
      const text = this.parser.parseInline(token.tokens);
      if (!SAFE_URL.test(token.href ?? "")) {
        return text;
      }
      const title = token.title ? ` title="${escapeHtml(token.title)}"` : "";
      return `<a href="${escapeHtml(token.href)}"${title}>${text}</a>`;
    },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/** Markdown text to sanitized HTML. */
export function render(text) {
  const html = marked.parse(text ?? "", { async: false });
  return DOMPurify.sanitize(html, {
    ALLOWED_URI_REGEXP: SAFE_URL,
    FORBID_TAGS: ["img", "style", "form", "input", "button", "iframe", "video", "audio", "source"],
    FORBID_ATTR: ["style", "src", "srcset"],
    ADD_ATTR: ["target"],
  });
}
