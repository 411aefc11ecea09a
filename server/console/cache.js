// The cache view: live charts from the server's own counters (GET /metrics), the KV pool, disk tier and
// document store now, and the caller's tenant's largest cached prefixes (GET /v1/cache).

import { getJSON, getText } from "./api.js";
import { LineChart, usageBar } from "./charts.js";
import { $, el, formatBytes, showError } from "./dom.js";
import { cachePoint, cacheTotals, parseMetrics } from "./metrics.js";

const POLL_MS = 2000;
const WINDOW_MS = 30000; // each chart point is over the latest 30 s of scrapes (rates, percentiles)
const percent = (v) => `${Math.round(v * 100)}%`;
const perSecond = (v) => (v >= 100 ? `${Math.round(v)}/s` : `${v.toFixed(1)}/s`);
const ms = (v) => (v >= 1 ? `${v.toFixed(2)} s` : `${Math.round(v * 1000)} ms`);
const count = (v) => String(Math.round(v));

let charts = null;
let history = []; // [{samples, at}] of the latest WINDOW_MS, oldest first
let timer = null;

export function mountCache(root) {
  charts = {
    hitRate: new LineChart("Prefix hit rate, last 30 s (prompt tokens not computed)", [{ key: "hitRate", label: "hit rate", color: "#1a9850" }], percent, { top: 1 }),
    tokens: new LineChart("Prompt tokens per second: served vs computed", [
      { key: "servedPerSecond", label: "served", color: "#1a9850" },
      { key: "computedPerSecond", label: "computed", color: "#888" },
    ], perSecond),
    ttft: new LineChart("Time to first token, last 30 s", [
      { key: "ttftP50", label: "p50", color: "#2c7fb8" },
      { key: "ttftP95", label: "p95", color: "#d95f0e" },
    ], ms),
    itl: new LineChart("Inter-token latency, last 30 s", [
      { key: "itlP50", label: "p50", color: "#2c7fb8" },
      { key: "itlP95", label: "p95", color: "#d95f0e" },
    ], ms),
    requests: new LineChart("Requests", [
      { key: "running", label: "running", color: "#7b3294" },
      { key: "waiting", label: "waiting", color: "#e66101" },
    ], count, { integer: true }),
  };
  root.append(
    el("div", { id: "cache-totals", class: "tiles" }),
    el("div", { id: "cache-error", class: "error", hidden: true }),
    el("div", { class: "charts" }, ...Object.values(charts).map((c) => c.element)),
    el("div", { id: "cache-usage", class: "usages" }),
    el("h2", {}, "Largest cached prefixes of your tenant"),
    el("p", { class: "muted" }, "Root-to-leaf paths of the radix tree under your cache salt: full pages only. Age counts the tree's lookups and inserts since the prefix was last used; locks are running requests and pins holding it."),
    el("table", { id: "prefixes", class: "prefixes" },
      el("thead", {}, el("tr", {}, ...["tokens", "pages", "derived", "hits", "age (ops)", "locks", "pinned", "text"].map((h) => el("th", {}, h)))),
      el("tbody", {})),
  );
}

export function startCache() {
  if (timer) return;
  poll();
  timer = setInterval(poll, POLL_MS);
}

export function stopCache() {
  clearInterval(timer);
  timer = null;
  history = [];
}

async function poll() {
  const errorBox = $("#cache-error");
  try {
    const [text, cache] = await Promise.all([getText("/metrics"), getJSON("/v1/cache?limit=20")]);
    const now = performance.now();
    const samples = parseMetrics(text);
    history = history.filter((scrape) => now - scrape.at <= WINDOW_MS);
    if (history.length) {
      const oldest = history[0];
      const point = cachePoint(oldest.samples, samples, (now - oldest.at) / 1000);
      for (const chart of Object.values(charts)) chart.push(point);
    }
    history.push({ samples, at: now });
    renderTotals(cacheTotals(samples), samples);
    renderUsage(cache);
    renderPrefixes(cache);
    showError(errorBox, null);
  } catch (error) {
    showError(errorBox, error);
  }
}

function tile(label, valueText, id) {
  return el("div", { class: "tile", id }, el("div", { class: "tile-value" }, valueText), el("div", { class: "tile-label" }, label));
}

function renderTotals(totals) {
  $("#cache-totals").replaceChildren(
    tile("hit rate since start", totals.hitRate === null ? "–" : percent(totals.hitRate), "tile-hit-rate"),
    tile("prompt tokens served from cache", count(totals.served), "tile-served"),
    tile("prompt tokens computed", count(totals.computed), "tile-computed"),
    tile("of the served: from the disk tier", count(totals.fromDisk)),
    tile("of the served: from the document store", count(totals.fromDocuments)),
  );
}

function renderUsage(cache) {
  const pool = cache.pool;
  const pageBytes = (pages) => `${pages} pages`;
  const usages = [
    usageBar("KV pool", [
      { label: "in use by requests", value: pool.num_pages_in_use, color: "#7b3294" },
      { label: "cached, idle", value: Math.max(0, pool.num_cached_pages - pool.num_pages_in_use), color: "#1a9850" },
    ], pool.num_pages, pageBytes),
  ];
  if (cache.disk_tier) usages.push(usageBar("Disk tier", [{ label: `${cache.disk_tier.num_pages} pages`, value: cache.disk_tier.num_bytes, color: "#2c7fb8" }], cache.disk_tier.max_bytes, formatBytes));
  else usages.push(el("div", { class: "usage muted" }, "Disk tier: off"));
  if (cache.document_store) usages.push(usageBar("Document store", [{ label: `${cache.document_store.num_entries} spans`, value: cache.document_store.num_bytes, color: "#984ea3" }], cache.document_store.max_bytes, formatBytes));
  else usages.push(el("div", { class: "usage muted" }, "Document store: off (serve --document-reuse)"));
  $("#cache-usage").replaceChildren(...usages);
}

function renderPrefixes(cache) {
  const body = $("#prefixes tbody");
  if (!cache.prefixes) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "muted" }, cache.prefixes_unavailable || "unavailable")));
    return;
  }
  if (!cache.prefixes.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "muted" }, "Nothing cached for your tenant yet.")));
    return;
  }
  body.replaceChildren(
    ...cache.prefixes.map((p) =>
      el("tr", { class: "prefix" },
        el("td", { class: "num" }, String(p.num_tokens)),
        el("td", { class: "num" }, String(p.num_pages)),
        el("td", { class: "num" }, p.num_derived_tokens ? String(p.num_derived_tokens) : ""),
        el("td", { class: "num" }, String(p.hit_count)),
        el("td", { class: "num" }, String(p.num_ops_since_use)),
        el("td", { class: "num" }, p.num_locking_requests ? String(p.num_locking_requests) : ""),
        el("td", { class: "num" }, p.num_pinned_tokens ? `${p.num_pinned_tokens} tok, ${p.pin_seconds_left}s` : ""),
        el("td", { class: "text" }, el("code", {}, p.head_text), p.tail_text ? el("span", { class: "muted" }, " … ") : "", p.tail_text ? el("code", {}, p.tail_text) : ""),
      ),
    ),
  );
}
