// The console's entry: the three views behind tabs, the API key dialog, the model's name in the header.

import { apiKey, getJSON, whenUnauthorized } from "./api.js";
import { mountCache, startCache, stopCache } from "./cache.js";
import { mountChat } from "./chat.js";
import { refreshCollections } from "./chat_settings.js";
import { mountCollections, showCollections } from "./collections.js";
import { $ } from "./dom.js";

const VIEWS = ["chat", "cache", "collections"];

function show(view) {
  for (const name of VIEWS) {
    $(`#view-${name}`).hidden = name !== view;
    $(`#tab-${name}`).setAttribute("aria-selected", String(name === view));
  }
  if (view === "cache") startCache();
  else stopCache();
  if (view === "collections") showCollections();
  if (view === "chat") refreshCollections();
  history.replaceState(null, "", `#${view}`);
}

function askForKey(message) {
  const dialog = $("#key-dialog");
  $("#key-message").textContent = message || "";
  $("#key-input").value = apiKey.get();
  if (!dialog.open) dialog.showModal();
}

async function loadModel() {
  try {
    const { data } = await getJSON("/v1/models");
    $("#model-name").textContent = data[0].id;
  } catch (error) {
    if (error.status !== 401) $("#model-name").textContent = error.message;
  }
}

function init() {
  mountChat($("#view-chat"));
  mountCache($("#view-cache"));
  mountCollections($("#view-collections"));
  for (const name of VIEWS) $(`#tab-${name}`).addEventListener("click", () => show(name));
  whenUnauthorized(() => askForKey(apiKey.get() ? "The server refused this key." : "This server needs an API key."));
  $("#key-button").addEventListener("click", () => askForKey(""));
  $("#key-form").addEventListener("submit", (event) => {
    if (!event.submitter || event.submitter.value !== "save") return;
    apiKey.set($("#key-input").value.trim());
    loadModel();
    refreshCollections();
  });
  $("#key-forget").addEventListener("click", () => {
    apiKey.set("");
    $("#key-input").value = "";
  });
  const view = location.hash.slice(1);
  show(VIEWS.includes(view) ? view : "chat");
  loadModel();
  performance.mark("console-ready"); // every view is built and answers input (measured: docs/console.md)
  document.body.dataset.ready = "true";
}

init();
