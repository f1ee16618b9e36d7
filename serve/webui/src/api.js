// Requests to this server: the API key (asked once, kept in sessionStorage), `/props`, and a
// streamed chat completion read as server-sent events.

const KEY = "onebit-pipe.key";

/** Raised when the server wants a key this page does not have. */
export class NeedsKey extends Error {}

export function key() {
  return sessionStorage.getItem(KEY) ?? "";
}

export function setKey(k) {
  sessionStorage.setItem(KEY, k);
}

function headers() {
  const h = { "content-type": "application/json" };
  const k = key();
  if (k) h.authorization = `Bearer ${k}`;
  return h;
}

async function failure(res) {
  if (res.status === 401) return new NeedsKey("this server needs an API key");
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body?.error?.message) message = body.error.message;
  } catch {
    // Not JSON: the status says it.
  }
  return new Error(message);
}

/**
 * `GET /health`: `{status, model, key_required}` once the model is ready; waits while it loads
 * (`onWait` is told), and raises if loading failed.
 */
export async function ready(onWait) {
  for (;;) {
    const res = await fetch("/health");
    const body = await res.json().catch(() => ({}));
    if (res.ok) return body;
    if (body.status !== "loading") throw new Error(body.error ?? `${res.status} ${res.statusText}`);
    onWait();
    await new Promise((r) => setTimeout(r, 1000));
  }
}

/** A served model's facts (`GET /props?model=ID`; loads it when it is not). */
export async function props(model) {
  const q = model ? `?model=${encodeURIComponent(model)}` : "";
  const res = await fetch(`/props${q}`, { headers: headers() });
  if (!res.ok) throw await failure(res);
  return res.json();
}

/** Every model the server serves, with its verdict, context and load state (`GET /v1/models`). */
export async function models() {
  const res = await fetch("/v1/models", { headers: headers() });
  if (!res.ok) throw await failure(res);
  return (await res.json()).data ?? [];
}

/**
 * Streams a chat completion of `body`. `on` gets `{reasoning, content}` pieces as they come;
 * resolves with `{usage, finish, firstAt, endAt, chunks}` (times from `performance.now()`).
 * `signal` stops it (the promise then resolves with what came, `finish: "stopped"`).
 */
export async function streamChat(body, on, signal) {
  const res = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!res.ok) throw await failure(res);
  const out = { usage: null, finish: null, firstAt: null, endAt: null, chunks: 0 };
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const handle = (data) => {
    if (data === "[DONE]") return;
    const v = JSON.parse(data);
    if (v.error) throw new Error(v.error.message ?? "the server failed");
    if (v.usage) out.usage = v.usage;
    for (const c of v.choices ?? []) {
      const d = c.delta ?? {};
      const piece = { reasoning: d.reasoning_content ?? "", content: d.content ?? "" };
      if (piece.reasoning || piece.content) {
        out.firstAt ??= performance.now();
        out.chunks += 1;
        on(piece);
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let at;
      while ((at = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, at);
        buffer = buffer.slice(at + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith("data: ")) handle(line.slice(6));
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") throw e;
    out.finish = "stopped";
  }
  out.endAt = performance.now();
  return out;
}
