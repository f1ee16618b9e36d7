// The chat page: conversations in the sidebar, the open one's messages, its settings, and the
// served pack's facts (name, context, kernel path, verification verdict with its report). On a
// server of several packs, a picker chooses the model (each marked loaded or not, and verified or
// not); a message to a model that is not loaded shows its load as it goes.

import { Chats, DEFAULTS } from "./chats.js";
import { NeedsKey, key, models, props, ready, setKey, streamChat } from "./api.js";
import { render } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const chats = new Chats();
let running = null; // the AbortController of the answer being streamed
let served = null; // /props of the chosen model, or what /v1/models says of it before it loads
let listed = []; // /v1/models
const MODEL_KEY = "onebit.model";
let attached = []; // data: URLs of the images the next message carries

// The image types the server decodes.
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];

const SETTINGS = Object.keys(DEFAULTS);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- the API key ----------------------------------------------------------------------------

function askKey() {
  return new Promise((resolve) => {
    const dialog = $("key-dialog");
    const form = $("key-form");
    const done = (ev) => {
      ev.preventDefault();
      setKey($("key-input").value.trim());
      form.removeEventListener("submit", done);
      dialog.close();
      resolve();
    };
    form.addEventListener("submit", done);
    dialog.showModal();
    $("key-input").focus();
  });
}

async function withKey(f) {
  for (;;) {
    try {
      return await f();
    } catch (e) {
      if (!(e instanceof NeedsKey)) throw e;
      await askKey();
    }
  }
}

// ---- the pack's facts -------------------------------------------------------------------------

function showPack(p) {
  const box = $("pack");
  box.replaceChildren();
  box.append(el("strong", "name", p.model));
  const backend = p.backend ?? "?";
  const facts = [
    `${p.default_generation_settings?.n_ctx ?? "?"} tokens of context`,
    backend.includes(p.kernel_path) ? backend : `${backend} · ${p.kernel_path}`,
  ];
  for (const f of facts) box.append(el("span", "fact", f));
  const v = p.verification ?? {};
  const verdict = el("span", v.verified ? "verdict ok" : "verdict bad");
  verdict.title = v.summary ?? "";
  verdict.textContent = v.verified ? "verified" : "not verified";
  if (p.report) {
    const a = el("a", null);
    a.href = p.report;
    a.target = "_blank";
    a.rel = "noopener";
    a.append(verdict);
    box.append(a);
  } else {
    box.append(verdict);
  }
}

/** The chosen model's entry of /v1/models. */
function chosen() {
  const want = localStorage.getItem(MODEL_KEY);
  return (
    listed.find((m) => m.id === want) ??
    listed.find((m) => m.loaded) ??
    listed.find((m) => m.verification?.verified) ??
    listed[0]
  );
}

/** The picker of a server of several models. */
function showPicker() {
  if (listed.length < 2) return;
  const pick = el("select", "picker");
  pick.id = "model";
  pick.setAttribute("aria-label", "Model");
  const current = chosen();
  for (const m of listed) {
    const state = m.loaded ? " · loaded" : m.status?.value === "loading" ? " · loading" : "";
    const verdict = m.verification?.verified ? "" : " · not verified";
    const o = el("option", null, `${m.id}${state}${verdict}`);
    o.value = m.id;
    o.selected = m.id === current?.id;
    pick.append(o);
  }
  pick.addEventListener("change", () => {
    localStorage.setItem(MODEL_KEY, pick.value);
    showModel();
  });
  $("pack").prepend(pick);
}

/** The chosen model's facts: /props when it is loaded, its listing otherwise. */
async function showModel() {
  const m = chosen();
  if (!m) {
    $("pack").replaceChildren(el("span", "muted", "no models"));
    return;
  }
  if (m.loaded || listed.length === 1) {
    served = await withKey(() => props(m.id));
    showPack(served);
  } else {
    served = { model: m.id, modalities: {} };
    const box = $("pack");
    box.replaceChildren();
    box.append(el("strong", "name", m.id));
    box.append(el("span", "fact", `${m.context_length} tokens of context`));
    box.append(el("span", "fact", "loads with your first message"));
    const v = m.verification ?? {};
    const verdict = el("span", v.verified ? "verdict ok" : "verdict bad");
    verdict.title = v.summary ?? "";
    verdict.textContent = v.verified ? "verified" : "not verified";
    box.append(verdict);
  }
  showPicker();
  $("attach").hidden = !served?.modalities?.image;
}

async function loadPack() {
  try {
    const health = await ready(() => {
      $("pack").replaceChildren(el("span", "muted", "loading the model…"));
    });
    if (health.key_required && !key()) await askKey();
    listed = await withKey(models);
    await showModel();
  } catch (e) {
    $("pack").replaceChildren(el("span", "error", `cannot reach the server: ${e.message}`));
  }
}

/**
 * While the model `id` loads for a message: its name and the seconds so far in the header,
 * until `stop()` is called.
 */
function showLoading(id) {
  const t0 = performance.now();
  const tick = () => {
    const s = Math.round((performance.now() - t0) / 1000);
    $("pack").replaceChildren(el("span", "muted loading", `loading ${id}… ${s} s`));
  };
  tick();
  const timer = setInterval(tick, 1000);
  return () => clearInterval(timer);
}

// ---- conversations ----------------------------------------------------------------------------

function showChats() {
  const list = $("chats");
  list.replaceChildren();
  for (const c of chats.list) {
    const li = el("li");
    const b = el("button", c.id === chats.currentId ? "chat open" : "chat", c.title);
    b.type = "button";
    b.addEventListener("click", () => {
      if (running) return;
      chats.open(c.id);
      showAll();
      document.body.classList.remove("side-open");
    });
    li.append(b);
    list.append(li);
  }
}

function showSettings() {
  const c = chats.current();
  $("set-system").value = c.system ?? "";
  for (const k of SETTINGS) $(`set-${k}`).value = c.settings?.[k] ?? DEFAULTS[k];
}

function readSettings() {
  const c = chats.current();
  c.system = $("set-system").value;
  c.settings = {};
  for (const k of SETTINGS) c.settings[k] = $(`set-${k}`).value;
  chats.save();
}

function stats(s) {
  if (!s) return "";
  const parts = [];
  if (s.ttft != null) parts.push(`${Math.round(s.ttft)} ms to first token`);
  if (s.tps != null) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  if (s.tokens != null) parts.push(`${s.tokens} tokens`);
  if (s.finish) parts.push(s.finish);
  return parts.join(" · ");
}

function messageNode(m) {
  const box = el("article", `msg ${m.role}`);
  if (m.role === "user") {
    if (m.images?.length) {
      const strip = el("div", "images");
      for (const url of m.images) strip.append(imageNode(url));
      box.append(strip);
    }
    box.append(el("div", "text plain", m.content));
    return box;
  }
  const thinking = el("details", "thinking");
  thinking.append(el("summary", null, "Thinking"));
  const thought = el("div", "text plain");
  thinking.append(thought);
  const body = el("div", "text markdown");
  const foot = el("div", "stats");
  box.append(thinking, body, foot);
  box.update = (msg) => {
    thinking.hidden = !msg.reasoning;
    thought.textContent = msg.reasoning ?? "";
    body.innerHTML = render(msg.content);
    for (const pre of body.querySelectorAll("pre")) {
      const copy = el("button", "copy", "Copy");
      copy.type = "button";
      copy.addEventListener("click", () => navigator.clipboard?.writeText(pre.innerText));
      pre.prepend(copy);
    }
    foot.textContent = msg.error ? `error: ${msg.error}` : stats(msg.stats);
    foot.classList.toggle("error", Boolean(msg.error));
  };
  box.update(m);
  return box;
}

// An image of a message: only data: URLs of image types are shown (they are all the page makes).
function imageNode(url) {
  const img = el("img", "thumb");
  img.alt = "attached image";
  if (typeof url === "string" && IMAGE_TYPES.some((t) => url.startsWith(`data:${t};base64,`))) {
    img.src = url;
  }
  return img;
}

// ---- attaching images ---------------------------------------------------------------------------

function showAttached() {
  const box = $("attached");
  box.replaceChildren();
  attached.forEach((url, i) => {
    const item = el("span", "attached");
    const drop = el("button", "icon", "×");
    drop.type = "button";
    drop.title = "Remove";
    drop.addEventListener("click", () => {
      attached.splice(i, 1);
      showAttached();
    });
    item.append(imageNode(url), drop);
    box.append(item);
  });
  box.hidden = attached.length === 0;
}

function attach(files) {
  if (!served?.modalities?.image) return;
  for (const f of files) {
    if (!IMAGE_TYPES.includes(f.type)) continue;
    const r = new FileReader();
    r.onload = () => {
      attached.push(r.result);
      showAttached();
    };
    r.readAsDataURL(f);
  }
}

function showMessages() {
  const box = $("messages");
  box.replaceChildren(...chats.current().messages.map(messageNode));
  box.scrollTop = box.scrollHeight;
}

function showAll() {
  showChats();
  showSettings();
  showMessages();
}

// ---- sending and stopping -----------------------------------------------------------------------

function number(v) {
  if (v === "" || v == null) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

function requestBody(c) {
  const messages = [];
  if (c.system?.trim()) messages.push({ role: "system", content: c.system });
  for (const m of c.messages) {
    if (m.role === "user" && m.images?.length) {
      const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
      parts.push({ type: "text", text: m.content });
      messages.push({ role: "user", content: parts });
    } else if (m.role === "user" || (m.role === "assistant" && !m.error)) {
      messages.push({ role: m.role, content: m.content });
    }
  }
  const body = { model: chosen()?.id ?? served?.model, messages };
  for (const k of SETTINGS) {
    const n = number(c.settings?.[k]);
    if (n !== undefined) body[k] = k === "top_k" || k === "max_tokens" || k === "seed" ? Math.trunc(n) : n;
  }
  return body;
}

function setRunning(r) {
  running = r;
  $("send").textContent = r ? "Stop" : "Send";
  $("send").classList.toggle("danger", Boolean(r));
  document.body.classList.toggle("running", Boolean(r));
}

async function send(text, images) {
  const c = chats.current();
  if (c.messages.length === 0) c.title = text.slice(0, 48) || "image";
  c.messages.push(images.length ? { role: "user", content: text, images } : { role: "user", content: text });
  const answer = { role: "assistant", content: "", reasoning: "" };
  const body = requestBody(c);
  c.messages.push(answer);
  chats.save();
  showChats();
  showMessages();
  const node = $("messages").lastElementChild;
  const ctrl = new AbortController();
  setRunning(ctrl);
  const t0 = performance.now();
  const entry = chosen();
  const loading = entry && !entry.loaded && listed.length > 1 ? showLoading(entry.id) : null;
  let frame = 0;
  const repaint = () => {
    frame = 0;
    node.update(answer);
    $("messages").scrollTop = $("messages").scrollHeight;
  };
  try {
    const out = await withKey(() =>
      streamChat(
        body,
        (piece) => {
          if (loading && !answer.content && !answer.reasoning) {
            loading();
            models().then((l) => {
              listed = l;
              showModel();
            });
          }
          answer.reasoning += piece.reasoning;
          answer.content += piece.content;
          frame ||= requestAnimationFrame(repaint);
        },
        ctrl.signal,
      ),
    );
    const tokens = out.usage?.completion_tokens ?? out.chunks;
    const decode = out.firstAt != null ? (out.endAt - out.firstAt) / 1000 : 0;
    answer.stats = {
      ttft: out.firstAt != null ? out.firstAt - t0 : null,
      tps: decode > 0 && tokens > 1 ? (tokens - 1) / decode : null,
      tokens,
      finish: out.finish,
    };
  } catch (e) {
    if (e.name === "AbortError") {
      answer.stats = { finish: "stopped" };
    } else {
      answer.error = e.message;
    }
  }
  if (frame) cancelAnimationFrame(frame);
  if (loading) {
    loading();
    listed = await models().catch(() => listed);
    await showModel().catch(() => {});
  }
  setRunning(null);
  chats.save();
  node.update(answer);
}

function stop() {
  running?.abort();
}

function exportChat() {
  const c = chats.current();
  const blob = new Blob([JSON.stringify(c, null, 2)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = `${c.title.replace(/[^\w.-]+/g, "_") || "chat"}.json`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ---- wiring -----------------------------------------------------------------------------------

function wire() {
  const input = $("input");
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (running) {
      stop();
      return;
    }
    const text = input.value.trim();
    if (!text && attached.length === 0) return;
    const images = attached;
    attached = [];
    showAttached();
    input.value = "";
    input.style.height = "";
    send(text, images);
  });
  $("attach").addEventListener("click", () => $("attach-file").click());
  $("attach-file").addEventListener("change", (ev) => {
    attach(ev.target.files);
    ev.target.value = "";
  });
  input.addEventListener("paste", (ev) => {
    const files = [...(ev.clipboardData?.files ?? [])];
    if (files.some((f) => IMAGE_TYPES.includes(f.type)) && served?.modalities?.image) {
      ev.preventDefault();
      attach(files);
    }
  });
  for (const zone of [$("composer"), $("messages")]) {
    zone.addEventListener("dragover", (ev) => {
      if (served?.modalities?.image && ev.dataTransfer?.types?.includes("Files")) ev.preventDefault();
    });
    zone.addEventListener("drop", (ev) => {
      if (!served?.modalities?.image) return;
      ev.preventDefault();
      attach(ev.dataTransfer?.files ?? []);
    });
  }
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  input.addEventListener("input", () => {
    input.style.height = "";
    input.style.height = `${Math.min(input.scrollHeight, 200)}px`;
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && running) {
      ev.preventDefault();
      stop();
    }
  });
  $("new-chat").addEventListener("click", () => {
    if (running) return;
    chats.create();
    showAll();
    document.body.classList.remove("side-open");
    input.focus();
  });
  $("rename-chat").addEventListener("click", () => {
    const c = chats.current();
    const title = prompt("Rename the conversation", c.title);
    if (title != null) {
      chats.rename(c.id, title);
      showChats();
    }
  });
  $("delete-chat").addEventListener("click", () => {
    if (running) return;
    const c = chats.current();
    if (confirm(`Delete "${c.title}"?`)) {
      chats.remove(c.id);
      showAll();
    }
  });
  $("export-chat").addEventListener("click", exportChat);
  $("toggle-settings").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
  });
  $("settings").addEventListener("input", readSettings);
  $("open-side").addEventListener("click", () => document.body.classList.add("side-open"));
  $("close-side").addEventListener("click", () => document.body.classList.remove("side-open"));
}

wire();
showAll();
loadPack();
$("input").focus();
