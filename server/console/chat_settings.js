// The chat's settings panel: system prompt, sampling fields, tool definitions (a JSON editor),
// documents for the prompt or a collection to retrieve from (the server's `documents` and `retrieval`
// extensions). Kept in localStorage; `requestFields()` turns them into request fields or throws.

import { getJSON } from "./api.js";
import { store } from "./chat_store.js";
import { $, el } from "./dom.js";

const EXAMPLE_TOOLS = JSON.stringify(
  [{ type: "function", function: { name: "get_weather", description: "Current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }],
  null,
  2,
);

function field(name, label, input) {
  input.id = `setting-${name}`;
  input.name = name;
  input.addEventListener("input", save);
  input.addEventListener("change", save);
  return el("label", { class: "field", for: input.id }, el("span", {}, label), input);
}

function save() {
  const settings = store.settings();
  for (const name of Object.keys(settings)) {
    const input = $(`#setting-${name}`);
    if (input) settings[name] = input.value;
  }
  store.saveSettings(settings);
  checkTools();
}

function checkTools() {
  const status = $("#tools-status");
  try {
    const tools = parseTools($("#setting-tools").value);
    status.textContent = tools ? `${tools.length} tool${tools.length === 1 ? "" : "s"}` : "no tools";
    status.className = "muted";
  } catch (error) {
    status.textContent = error.message;
    status.className = "error-text";
  }
}

function parseTools(text) {
  if (!text.trim()) return null;
  let tools;
  try {
    tools = JSON.parse(text);
  } catch (error) {
    throw new Error(`tools: not JSON (${error.message})`);
  }
  if (!Array.isArray(tools)) throw new Error("tools: a JSON array of {type: 'function', function: {...}}");
  return tools;
}

export function settingsPanel() {
  const s = store.settings();
  const collection = el("select", {}, el("option", { value: "" }, "none"));
  const panel = el(
    "aside",
    { class: "settings" },
    el("h2", {}, "Settings"),
    field("system", "System prompt", el("textarea", { rows: "3", value: s.system })),
    el(
      "div",
      { class: "row" },
      field("temperature", "Temperature", el("input", { type: "number", min: "0", max: "2", step: "0.1", value: s.temperature })),
      field("top_p", "Top p", el("input", { type: "number", min: "0", max: "1", step: "0.05", value: s.top_p, placeholder: "default" })),
    ),
    el(
      "div",
      { class: "row" },
      field("max_tokens", "Max tokens", el("input", { type: "number", min: "1", value: s.max_tokens })),
      field("seed", "Seed", el("input", { type: "number", value: s.seed, placeholder: "random" })),
    ),
    el(
      "details",
      { id: "tools-settings", open: s.tools ? true : undefined },
      el("summary", {}, "Tools"),
      field("tools", "Definitions (JSON array)", el("textarea", { rows: "8", class: "code", spellcheck: "false", value: s.tools, placeholder: EXAMPLE_TOOLS })),
      el("div", { id: "tools-status", class: "muted" }),
      field("tool_choice", "Tool choice", el("select", {}, ...["auto", "required", "none"].map((v) => el("option", { value: v, selected: v === s.tool_choice }, v)))),
      el("button", { type: "button", onclick: () => { $("#setting-tools").value = EXAMPLE_TOOLS; save(); } }, "Insert example"),
    ),
    el(
      "details",
      { id: "documents-settings", open: s.documents || s.collection ? true : undefined },
      el("summary", {}, "Documents (RAG)"),
      field("documents", "Documents for the prompt (separate with a line of ---)", el("textarea", { rows: "4", value: s.documents })),
      el("div", { class: "row" }, field("collection", "Retrieve from collection", collection),
        field("top_k", "Top k", el("input", { type: "number", min: "1", max: "32", value: s.top_k }))),
    ),
  );
  refreshCollections(collection, s.collection);
  queueMicrotask(checkTools);
  return panel;
}

// The collection picker lists the server's collections (also after the Collections view changed them).
export async function refreshCollections(select = $("#setting-collection"), chosen = store.settings().collection) {
  if (!select) return;
  try {
    const { data } = await getJSON("/v1/collections");
    select.replaceChildren(el("option", { value: "" }, "none"), ...data.map((c) => el("option", { value: c.name }, `${c.name} (${c.num_documents})`)));
    select.value = data.some((c) => c.name === chosen) ? chosen : "";
  } catch (_) {
    /* the key dialog handles 401; the list stays as it was */
  }
}

function number(text, name) {
  if (text === "" || text === undefined) return undefined;
  const value = Number(text);
  if (!Number.isFinite(value)) throw new Error(`${name}: not a number`);
  return value;
}

export function requestFields() {
  const s = store.settings();
  const fields = {
    temperature: number(s.temperature, "temperature"),
    top_p: number(s.top_p, "top p"),
    max_tokens: number(s.max_tokens, "max tokens"),
    seed: number(s.seed, "seed"),
  };
  const tools = parseTools(s.tools);
  if (tools) {
    fields.tools = tools;
    if (s.tool_choice !== "auto") fields.tool_choice = s.tool_choice;
  }
  const documents = s.documents.split(/^\s*---\s*$/m).map((text) => text.trim()).filter(Boolean);
  if (documents.length) fields.documents = documents.map((text, i) => ({ id: `doc-${i + 1}`, text }));
  if (s.collection) fields.retrieval = { collection: s.collection, top_k: number(s.top_k, "top k") || 4 };
  for (const name of Object.keys(fields)) if (fields[name] === undefined) delete fields[name];
  return fields;
}
