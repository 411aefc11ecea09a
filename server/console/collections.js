// The collections view: list, create, add files (drag and drop or pick, with progress), search.
// Files are read as text in the browser and sent to POST /v1/collections/{name}/documents one by one;
// the server chunks, embeds and (with document reuse) computes their KV before it answers.

import { getJSON, sendJSON, sendJSONWithProgress } from "./api.js";
import { refreshCollections } from "./chat_settings.js";
import { $, el, showError } from "./dom.js";

let chosen = null; // the collection name files go to and searches run in

export function mountCollections(root) {
  root.append(
    el("div", { class: "collections-layout" },
      el("section", {},
        el("h2", {}, "Collections"),
        el("form", { id: "create-collection", class: "inline-form", onsubmit: onCreate },
          el("input", { id: "collection-name", placeholder: "new collection name", required: true }),
          el("button", { class: "primary", type: "submit" }, "Create")),
        el("div", { id: "collections-error", class: "error", hidden: true }),
        el("ul", { id: "collection-list", class: "collection-list" })),
      el("section", { id: "collection-detail", hidden: true },
        el("h2", { id: "collection-title" }),
        el("div", { id: "drop-zone", class: "drop-zone", tabindex: "0" },
          el("p", {}, "Drop text files here, or "),
          el("label", { class: "button" }, "choose files", el("input", { id: "file-input", type: "file", multiple: true, hidden: true, onchange: (e) => addFiles([...e.target.files]) }))),
        el("ul", { id: "uploads", class: "uploads" }),
        el("form", { id: "search-form", class: "inline-form", onsubmit: onSearch },
          el("input", { id: "search-query", placeholder: "search this collection", required: true }),
          el("button", { type: "submit" }, "Search")),
        el("ol", { id: "search-results", class: "search-results" }))),
  );
  const zone = $("#drop-zone");
  for (const name of ["dragenter", "dragover"]) {
    zone.addEventListener(name, (event) => {
      event.preventDefault();
      zone.classList.add("over");
    });
  }
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    addFiles([...event.dataTransfer.files]);
  });
}

export async function showCollections() {
  const errorBox = $("#collections-error");
  try {
    const { data } = await getJSON("/v1/collections");
    $("#collection-list").replaceChildren(
      ...data.map((c) =>
        el("li", { class: c.name === chosen ? "current" : "", "data-name": c.name },
          el("button", { class: "link", onclick: () => choose(c.name) }, c.name),
          el("span", { class: "muted" }, ` ${c.num_documents} documents, ${c.num_chunks} chunks`))),
    );
    if (!data.length) $("#collection-list").append(el("li", { class: "muted" }, "No collections yet."));
    showError(errorBox, null);
  } catch (error) {
    showError(errorBox, error);
  }
}

function choose(name) {
  chosen = name;
  $("#collection-detail").hidden = false;
  $("#collection-title").textContent = name;
  $("#uploads").replaceChildren();
  $("#search-results").replaceChildren();
  showCollections();
}

async function onCreate(event) {
  event.preventDefault();
  const name = $("#collection-name").value.trim();
  try {
    await sendJSON("POST", "/v1/collections", { name });
    $("#collection-name").value = "";
    choose(name);
    refreshCollections();
  } catch (error) {
    showError($("#collections-error"), error);
  }
}

async function addFiles(files) {
  if (!chosen) return;
  const name = chosen;
  for (const file of files) {
    const bar = el("progress", { max: "1", value: "0" });
    const status = el("span", { class: "muted" }, "reading");
    const row = el("li", { class: "upload", "data-file": file.name }, el("span", { class: "file-name" }, file.name), bar, status);
    $("#uploads").append(row);
    try {
      const text = await file.text();
      if (!text.trim()) throw new Error("the file is empty");
      status.textContent = "uploading";
      const body = { documents: [{ id: file.name, text, metadata: { title: file.name } }] };
      const result = await sendJSONWithProgress(`/v1/collections/${encodeURIComponent(name)}/documents`, body, (fraction) => {
        bar.value = fraction;
        if (fraction >= 1) status.textContent = "embedding and computing KV";
      });
      bar.value = 1;
      status.textContent = `added (${result.num_precomputed_tokens} tokens of KV computed${result.precompute_skipped ? `; ${result.precompute_skipped}` : ""})`;
      row.classList.add("done");
    } catch (error) {
      status.textContent = error.message;
      row.classList.add("failed");
    }
  }
  showCollections();
  refreshCollections();
}

async function onSearch(event) {
  event.preventDefault();
  const query = $("#search-query").value.trim();
  try {
    const { data } = await sendJSON("POST", `/v1/collections/${encodeURIComponent(chosen)}/search`, { query, top_k: 5 });
    $("#search-results").replaceChildren(
      ...data.map((hit) => el("li", {}, el("div", {}, el("strong", {}, hit.chunk_id), el("span", { class: "muted" }, ` score ${hit.score.toFixed(3)}`)), el("p", {}, hit.text))),
    );
    if (!data.length) $("#search-results").append(el("li", { class: "muted" }, "No hits."));
  } catch (error) {
    showError($("#collections-error"), error);
  }
}
