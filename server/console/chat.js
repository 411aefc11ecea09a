// The chat view: streamed answers (POST /v1/chat/completions with SSE), system prompt, sampling fields,
// tools (definitions as JSON, calls as cards, results typed in), documents or a collection for RAG, and
// under each answer the bar of where its prompt tokens came from (tokenbar.js).

import { getJSON, stream } from "./api.js";
import { store, newConversation } from "./chat_store.js";
import { $, el, showError } from "./dom.js";
import { settingsPanel, requestFields } from "./chat_settings.js";
import { tokenBar } from "./tokenbar.js";

let conversation = null;
let running = null; // AbortController of the answer streaming now

export function mountChat(root) {
  root.append(
    el(
      "div",
      { class: "chat-layout" },
      el(
        "aside",
        { class: "conversations" },
        el("button", { id: "new-chat", class: "primary", onclick: () => open(newConversation()) }, "New chat"),
        el("ul", { id: "conversation-list" }),
      ),
      el(
        "section",
        { class: "chat-main" },
        el("div", { id: "messages", class: "messages", "aria-live": "polite" }),
        el("div", { id: "chat-error", class: "error", hidden: true }),
        el(
          "form",
          { id: "composer", class: "composer", onsubmit: onSend },
          el("textarea", { id: "chat-input", rows: "3", placeholder: "Message (Enter sends, Shift+Enter: new line)", onkeydown: onKey }),
          el(
            "div",
            { class: "composer-buttons" },
            el("button", { id: "chat-send", class: "primary", type: "submit" }, "Send"),
            el("button", { id: "chat-stop", type: "button", hidden: true, onclick: () => running && running.abort() }, "Stop"),
          ),
        ),
      ),
      settingsPanel(),
    ),
  );
  const current = store.get(store.currentId());
  open(current || newConversation());
}

function onKey(event) {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("#composer").requestSubmit();
  }
}

function open(next) {
  if (running) running.abort();
  conversation = next;
  store.setCurrent(conversation.id);
  renderList();
  renderMessages();
}

function persist() {
  if (!conversation.messages.length) return;
  if (conversation.title === "New chat") {
    const first = conversation.messages.find((m) => m.role === "user");
    if (first) conversation.title = first.content.slice(0, 40);
  }
  store.save(conversation);
  renderList();
}

function renderList() {
  const list = $("#conversation-list");
  list.replaceChildren(
    ...store.conversations().map((c) =>
      el(
        "li",
        { class: c.id === conversation.id ? "current" : "" },
        el("button", { class: "link", onclick: () => open(store.get(c.id)) }, c.title || "Untitled"),
        el("button", {
          class: "icon",
          title: "Delete conversation",
          "aria-label": "Delete conversation",
          onclick: () => {
            store.remove(c.id);
            if (c.id === conversation.id) open(newConversation());
            else renderList();
          },
        }, "×"),
      ),
    ),
  );
}

function renderMessages() {
  const container = $("#messages");
  container.replaceChildren(...conversation.messages.map(messageView));
  if (!conversation.messages.length) {
    container.append(el("p", { class: "hint" }, "Ask something. Each answer shows where its prompt's tokens came from: the prefix cache, the disk tier, the document store, or computed."));
  }
  container.scrollTop = container.scrollHeight;
}

function messageView(message, index) {
  if (message.role === "tool") {
    return el("div", { class: "message tool" }, el("div", { class: "role" }, `tool result (${message.tool_call_id})`), el("pre", { class: "content" }, message.content));
  }
  const view = el("div", { class: `message ${message.role}`, "data-index": String(index) },
    el("div", { class: "role" }, message.role), el("div", { class: "content" }, message.content || ""));
  if (message.tool_calls && message.tool_calls.length) view.append(toolCards(message, index));
  if (message.meta && message.meta.retrieved) {
    view.append(el("div", { class: "retrieved muted" }, "retrieved: ",
      ...message.meta.retrieved.map((d) => el("span", { class: "retrieved-chunk" }, `${d.chunk_id} (${d.score.toFixed(2)}) `))));
  }
  if (message.meta && message.meta.record) view.append(tokenBar(message.meta.record, message.meta.usage));
  else if (message.meta && message.meta.error) view.append(el("div", { class: "error" }, message.meta.error));
  return view;
}

function toolCards(message, index) {
  const answered = new Set(conversation.messages.filter((m) => m.role === "tool").map((m) => m.tool_call_id));
  const isOpen = index === conversation.messages.length - 1;
  const inputs = [];
  const cards = message.tool_calls.map((call) => {
    const input = el("textarea", { class: "tool-result", rows: "2", placeholder: "Type the tool's result", "data-call-id": call.id });
    if (isOpen && !answered.has(call.id)) inputs.push(input);
    let args = call.function.arguments;
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch (_) {
      /* shown as streamed */
    }
    return el("div", { class: "tool-card" },
      el("div", { class: "tool-name" }, `${call.function.name}`, el("span", { class: "muted" }, ` ${call.id}`)),
      el("pre", {}, args),
      isOpen && !answered.has(call.id) ? input : "");
  });
  const box = el("div", { class: "tool-cards" }, ...cards);
  if (inputs.length) {
    box.append(el("button", { class: "primary", onclick: () => sendToolResults(message, inputs) }, "Send results"));
  }
  return box;
}

function sendToolResults(message, inputs) {
  for (const input of inputs) {
    conversation.messages.push({ role: "tool", tool_call_id: input.dataset.callId, content: input.value });
  }
  persist();
  answer();
}

function onSend(event) {
  event.preventDefault();
  const input = $("#chat-input");
  const text = input.value.trim();
  if (!text || running) return;
  input.value = "";
  conversation.messages.push({ role: "user", content: text });
  persist();
  answer();
}

// The messages as the API takes them: the system prompt first, `meta` left out.
function apiMessages(settings) {
  const messages = settings.system.trim() ? [{ role: "system", content: settings.system }] : [];
  for (const m of conversation.messages) {
    const message = { role: m.role, content: m.content };
    if (m.tool_calls && m.tool_calls.length) {
      message.tool_calls = m.tool_calls;
      if (!m.content) message.content = null;
    }
    if (m.tool_call_id) message.tool_call_id = m.tool_call_id;
    messages.push(message);
  }
  return messages;
}

async function answer() {
  const errorBox = $("#chat-error");
  showError(errorBox, null);
  let fields;
  try {
    fields = requestFields();
  } catch (error) {
    showError(errorBox, error);
    return;
  }
  const body = { ...fields, messages: apiMessages(store.settings()), stream: true, stream_options: { include_usage: true } };
  const reply = { role: "assistant", content: "", tool_calls: [], meta: {} };
  conversation.messages.push(reply);
  renderMessages();
  const view = $("#messages").lastElementChild;
  const content = $(".content", view);
  view.classList.add("streaming");
  running = new AbortController();
  setBusy(true);
  let responseId = null;
  let usage = null;
  let retrieved = null; // the `retrieval` extension's chunks, on the stream's first chunk
  try {
    await stream("/v1/chat/completions", body, (chunk) => {
      responseId = chunk.id;
      if (chunk.usage) usage = chunk.usage;
      if (chunk.retrieved_documents) retrieved = chunk.retrieved_documents;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.content) {
          reply.content += delta.content;
          content.textContent = reply.content;
        }
        for (const call of delta.tool_calls || []) {
          const slot = reply.tool_calls[call.index] || (reply.tool_calls[call.index] = { id: "", type: "function", function: { name: "", arguments: "" } });
          if (call.id) slot.id = call.id;
          if (call.function && call.function.name) slot.function.name += call.function.name;
          if (call.function && call.function.arguments) slot.function.arguments += call.function.arguments;
          content.textContent = reply.content + (reply.content ? "\n" : "") + `→ calling ${slot.function.name}…`;
        }
      }
      $("#messages").scrollTop = $("#messages").scrollHeight;
    }, { signal: running.signal });
    reply.meta = { requestId: responseId, usage, retrieved };
    if (responseId) reply.meta.record = await getJSON(`/v1/requests/${encodeURIComponent(responseId)}`);
  } catch (error) {
    if (error.name === "AbortError") reply.meta = { error: "stopped" };
    else reply.meta = { error: error.message };
    if (!reply.content && !reply.tool_calls.length) conversation.messages.pop();
    if (error.name !== "AbortError") showError(errorBox, error);
  } finally {
    running = null;
    setBusy(false);
  }
  if (!reply.tool_calls.length) delete reply.tool_calls;
  persist();
  renderMessages();
}

function setBusy(isBusy) {
  $("#chat-send").disabled = isBusy;
  $("#chat-stop").hidden = !isBusy;
}
