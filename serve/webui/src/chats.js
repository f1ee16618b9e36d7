// Conversations, kept in the browser's localStorage: each with its title, system prompt,
// sampling settings and messages. Nothing leaves the browser but the requests to this server.

const KEY = "onebit-pipe.chats.v1";
const CURRENT = "onebit-pipe.current.v1";

/** The sampling settings a new conversation starts with (what llama-server's page uses). */
export const DEFAULTS = {
  temperature: 0.7,
  top_p: 0.95,
  top_k: 40,
  min_p: 0.05,
  presence_penalty: 0,
  frequency_penalty: 0,
  repetition_penalty: 1,
  max_tokens: 1024,
  seed: "",
};

function newId() {
  const a = new Uint8Array(8);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Every conversation and which one is open. */
export class Chats {
  constructor() {
    let list = [];
    try {
      list = JSON.parse(localStorage.getItem(KEY) ?? "[]");
    } catch {
      list = [];
    }
    this.list = Array.isArray(list) ? list.filter((c) => c && typeof c.id === "string") : [];
    this.currentId = localStorage.getItem(CURRENT);
    if (!this.current()) {
      this.currentId = this.list[0]?.id ?? this.create().id;
    }
  }

  /** The open conversation. */
  current() {
    return this.list.find((c) => c.id === this.currentId);
  }

  /** A new, empty conversation, opened. */
  create() {
    const c = {
      id: newId(),
      title: "New chat",
      created: Date.now(),
      system: "",
      settings: { ...DEFAULTS },
      messages: [],
    };
    this.list.unshift(c);
    this.currentId = c.id;
    this.save();
    return c;
  }

  open(id) {
    if (this.list.some((c) => c.id === id)) {
      this.currentId = id;
      this.save();
    }
  }

  rename(id, title) {
    const c = this.list.find((x) => x.id === id);
    if (c && title.trim()) {
      c.title = title.trim().slice(0, 120);
      this.save();
    }
  }

  remove(id) {
    this.list = this.list.filter((c) => c.id !== id);
    if (this.currentId === id) {
      this.currentId = this.list[0]?.id ?? this.create().id;
    }
    this.save();
  }

  save() {
    try {
      localStorage.setItem(KEY, JSON.stringify(this.list));
    } catch {
      // Over the browser's storage quota (images are large): kept without their images' bytes.
      const light = this.list.map((c) => ({
        ...c,
        messages: c.messages.map(({ images, ...m }) => (images ? { ...m, content: `${m.content} [image]` } : m)),
      }));
      localStorage.setItem(KEY, JSON.stringify(light));
    }
    localStorage.setItem(CURRENT, this.currentId);
  }
}
