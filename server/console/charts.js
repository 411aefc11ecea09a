// A small line chart on a canvas: a few series over the latest points, a y axis from 0, a legend.
// No library: the console ships no third-party code.

import { el } from "./dom.js";

const MAX_POINTS = 90; // 3 minutes at one point every 2 s

export class LineChart {
  // series: [{key, label, color}]; format(value) -> axis and legend text; options: {top} a fixed top
  // of the y axis, {integer} ticks on whole numbers
  constructor(title, series, format, options = {}) {
    this.series = series;
    this.format = format;
    this.options = options;
    this.points = [];
    this.canvas = el("canvas", { width: "420", height: "150" });
    this.legend = el("div", { class: "chart-legend" });
    this.element = el("figure", { class: "chart" }, el("figcaption", {}, title), this.canvas, this.legend);
  }

  push(point) {
    this.points.push(point);
    if (this.points.length > MAX_POINTS) this.points.shift();
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 420;
    const height = canvas.clientHeight || 150;
    if (canvas.width !== Math.round(width * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);
    const left = 52;
    const bottom = height - 16;
    const values = this.points.flatMap((p) => this.series.map((s) => p[s.key])).filter((v) => v !== null && v !== undefined);
    let top = this.options.top || Math.max(...values, 0) * 1.15 || 1;
    if (this.options.integer) top = Math.max(3, Math.ceil(top / 3) * 3);
    const style = getComputedStyle(document.documentElement);
    context.strokeStyle = style.getPropertyValue("--grid").trim() || "#ddd";
    context.fillStyle = style.getPropertyValue("--muted").trim() || "#666";
    context.font = "11px system-ui, sans-serif";
    context.lineWidth = 1;
    for (let i = 0; i <= 3; i += 1) {
      const y = bottom - ((bottom - 8) * i) / 3;
      context.beginPath();
      context.moveTo(left, y);
      context.lineTo(width - 4, y);
      context.stroke();
      context.fillText(this.format((top * i) / 3), 2, y + 4);
    }
    const step = (width - 4 - left) / (MAX_POINTS - 1);
    const start = left + (MAX_POINTS - this.points.length) * step;
    for (const s of this.series) {
      context.strokeStyle = s.color;
      context.lineWidth = 2;
      context.beginPath();
      let drawing = false;
      this.points.forEach((p, i) => {
        const v = p[s.key];
        if (v === null || v === undefined) {
          drawing = false;
          return;
        }
        const x = start + i * step;
        const y = bottom - ((bottom - 8) * v) / top;
        if (drawing) context.lineTo(x, y);
        else context.moveTo(x, y);
        drawing = true;
      });
      context.stroke();
    }
    const last = this.points[this.points.length - 1] || {};
    this.legend.replaceChildren(
      ...this.series.map((s) =>
        el("span", { class: "legend-item" }, el("i", { class: "swatch", style: `background:${s.color}` }),
          `${s.label} ${last[s.key] === null || last[s.key] === undefined ? "–" : this.format(last[s.key])}`),
      ),
    );
  }
}

// A horizontal usage bar: parts [{label, value, color}] of a whole.
export function usageBar(title, parts, whole, format) {
  const bar = el("div", { class: "usagebar" });
  for (const part of parts) {
    if (part.value > 0) bar.append(el("span", { style: `flex-basis:${(100 * part.value) / whole}%;background:${part.color}`, title: `${part.label}: ${format(part.value)}` }));
  }
  return el(
    "div",
    { class: "usage" },
    el("div", { class: "usage-title" }, title, el("span", { class: "muted" }, ` ${format(parts.reduce((a, p) => a + p.value, 0))} of ${format(whole)}`)),
    bar,
    el("div", { class: "chart-legend" }, ...parts.map((p) => el("span", { class: "legend-item" }, el("i", { class: "swatch", style: `background:${p.color}` }), `${p.label} ${format(p.value)}`))),
  );
}
