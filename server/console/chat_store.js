// Conversations and chat settings, kept in this browser's localStorage (nothing of them on the server).
//
// conversation = {id, title, created (ms), messages: [message]}; message = an OpenAI chat message
// ({role, content, tool_calls?, tool_call_id?}) plus, on assistant turns, `meta` (never sent): the
// request id, GET /v1/requests/{id}'s body and the usage the stream reported.

const CONVERSATIONS = "radixserve.conversations";
const CURRENT = "radixserve.currentConversation";
const SETTINGS = "radixserve.chatSettings";

export const DEFAULT_SETTINGS = {
  system: "You are a helpful assistant.",
  temperature: "0.7",
  top_p: "",
  max_tokens: "256",
  seed: "",
  tools: "",
  tool_choice: "auto",
  documents: "",
  collection: "",
  top_k: "4",
};

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch (_) {
    return fallback;
  }
}

export const store = {
  conversations() {
    return read(CONVERSATIONS, []);
  },
  save(conversation) {
    const all = this.conversations().filter((c) => c.id !== conversation.id);
    all.unshift(conversation);
    localStorage.setItem(CONVERSATIONS, JSON.stringify(all));
  },
  remove(id) {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(this.conversations().filter((c) => c.id !== id)));
  },
  get(id) {
    return this.conversations().find((c) => c.id === id) || null;
  },
  currentId() {
    return localStorage.getItem(CURRENT);
  },
  setCurrent(id) {
    localStorage.setItem(CURRENT, id);
  },
  settings() {
    return { ...DEFAULT_SETTINGS, ...read(SETTINGS, {}) };
  },
  saveSettings(settings) {
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  },
};

export function newConversation() {
  const id = `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;
  return { id, title: "New chat", created: Date.now(), messages: [] };
}
