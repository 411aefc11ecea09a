// Where one answer's prompt tokens came from: a bar of the prompt's tokens coloured by origin, from
// GET /v1/requests/{id} (the engine's own accounting), with TTFT, TPOT and speculation's acceptance.

import { el } from "./dom.js";

export const ORIGINS = [
  ["prefix_cache", "prefix cache"],
  ["disk_tier", "disk tier"],
  ["document_store", "document store"],
  ["boundary_recompute", "boundary recompute"],
  ["computed", "computed"],
];

function milliseconds(seconds) {
  return seconds === null || seconds === undefined ? "–" : `${(seconds * 1000).toFixed(seconds < 0.1 ? 1 : 0)} ms`;
}

// `record`: the GET /v1/requests/{id} body; `apiUsage`: the usage the chat stream reported.
export function tokenBar(record, apiUsage) {
  const sources = record.prompt_token_sources;
  const total = record.usage.prompt_tokens;
  const cached = sources.prefix_cache + sources.disk_tier + sources.document_store;
  const bar = el("div", { class: "tokenbar", role: "img", "aria-label": "prompt tokens by origin" });
  for (const [name, label] of ORIGINS) {
    const count = sources[name];
    if (!count) continue;
    bar.append(
      el("span", {
        class: `segment origin-${name}`,
        style: `flex-grow: ${count}`,
        title: `${label}: ${count} tokens`,
        "data-origin": name,
        "data-tokens": String(count),
      }),
    );
  }
  const legend = el("div", { class: "legend" });
  for (const [name, label] of ORIGINS) {
    if (!sources[name] && name !== "computed" && name !== "prefix_cache") continue;
    legend.append(el("span", { class: "legend-item" }, el("i", { class: `swatch origin-${name}` }), `${label} ${sources[name]}`));
  }
  const speculation = record.speculation;
  const acceptance =
    speculation.draft_tokens > 0
      ? `${speculation.accepted_tokens}/${speculation.draft_tokens} drafts accepted (${Math.round(speculation.acceptance_rate * 100)}%)`
      : "no drafts";
  const share = total ? Math.round((100 * cached) / total) : 0;
  const apiCached = apiUsage ? apiUsage.prompt_tokens_details.cached_tokens : null;
  const facts = el(
    "div",
    { class: "facts" },
    el("span", {}, `prompt ${total} tokens, ${share}% not computed`),
    el("span", {}, `TTFT ${milliseconds(record.timings.ttft_seconds)}`),
    el("span", {}, `TPOT ${milliseconds(record.timings.tpot_seconds)}`),
    el("span", {}, acceptance),
    apiCached === null ? "" : el("span", { class: "api-cached" }, `API cached_tokens ${apiCached}`),
  );
  return el(
    "div",
    {
      class: "origins",
      "data-request-id": record.id,
      "data-prompt-tokens": String(total),
      "data-cached-tokens": String(cached),
      "data-api-cached-tokens": apiCached === null ? "" : String(apiCached),
    },
    bar,
    legend,
    facts,
  );
}
