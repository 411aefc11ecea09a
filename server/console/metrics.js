// Prometheus text (GET /metrics) -> samples, and what the cache view derives from two scrapes:
// rates of counters and quantiles of histograms over the window between them.

const PREFIX = "radixserve:";

// -> Map(name -> [{labels: {..}, value}]) with the radixserve: prefix dropped.
export function parseMetrics(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([^\s{]+)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const name = match[1].startsWith(PREFIX) ? match[1].slice(PREFIX.length) : match[1];
    const labels = {};
    for (const pair of (match[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    if (!samples.has(name)) samples.set(name, []);
    samples.get(name).push({ labels, value: Number(match[4]) });
  }
  return samples;
}

export function value(samples, name) {
  const found = samples.get(name);
  return found && found.length ? found[0].value : 0;
}

// Cumulative buckets of a histogram: [[upper bound, count], ...] sorted, +Inf last.
function buckets(samples, name) {
  return (samples.get(`${name}_bucket`) || [])
    .map((s) => [s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), s.value])
    .sort((a, b) => a[0] - b[0]);
}

// The q-quantile of the observations between two scrapes (linear within a bucket, as Prometheus's
// histogram_quantile); null when there were none.
export function windowQuantile(before, after, name, q) {
  const now = buckets(after, name);
  const then = new Map(buckets(before, name));
  const counts = now.map(([bound, count]) => [bound, count - (then.get(bound) || 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const [bound, count] of counts) {
    if (count >= rank) {
      if (bound === Infinity) return lowerBound;
      const inBucket = count - lowerCount;
      return inBucket > 0 ? lowerBound + ((bound - lowerBound) * (rank - lowerCount)) / inBucket : bound;
    }
    lowerBound = bound;
    lowerCount = count;
  }
  return lowerBound;
}

// What the cache view charts from two scrapes `seconds` apart.
export function cachePoint(before, after, seconds) {
  const delta = (name) => value(after, name) - value(before, name);
  const queried = delta("prefix_cache_queries_total");
  const fromTree = delta("prefix_cache_hits_total"); // the tree and the disk tier
  const fromDocuments = delta("document_reuse_tokens_total");
  const served = fromTree + fromDocuments;
  return {
    hitRate: queried > 0 ? served / queried : null,
    servedPerSecond: served / seconds,
    computedPerSecond: Math.max(0, queried - served) / seconds,
    ttftP50: windowQuantile(before, after, "time_to_first_token_seconds", 0.5),
    ttftP95: windowQuantile(before, after, "time_to_first_token_seconds", 0.95),
    itlP50: windowQuantile(before, after, "inter_token_latency_seconds", 0.5),
    itlP95: windowQuantile(before, after, "inter_token_latency_seconds", 0.95),
    running: value(after, "num_requests_running"),
    waiting: value(after, "num_requests_waiting"),
  };
}

// Totals since the server started.
export function cacheTotals(samples) {
  const queried = value(samples, "prefix_cache_queries_total");
  const served = value(samples, "prefix_cache_hits_total") + value(samples, "document_reuse_tokens_total");
  return { queried, served, computed: Math.max(0, queried - served), hitRate: queried > 0 ? served / queried : null,
    fromDisk: value(samples, "kv_disk_hits_total"), fromDocuments: value(samples, "document_reuse_tokens_total") };
}
