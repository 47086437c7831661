// Chart building blocks on top of uPlot: line/band charts, percentile bands,
// the layer-scale stack plot, exact hover readouts and PNG export.
//
// uPlot: a small canvas chart library with log axes and drag-zoom, cheap
// enough per instance for a grid of 200 panels (measured in
// benchmarks/frontend_bench.py); SVG-based libraries make a DOM node per point.

import uPlot from "uplot";
import { h } from "./dom.js";
import { fmt, tick } from "./format.js";
import { logSplits, positiveOnly, safeLogRange } from "./logaxis.js";
import { theme } from "./theme.js";

const live = new Set();

/** Destroys every chart inside `root` (before re-rendering a view). */
export function destroyCharts(root) {
  for (const c of [...live]) {
    if (!root || root.contains(c.el)) {
      c.destroy();
    }
  }
}

/** Re-fits all live charts to their containers (window resize). */
export function resizeCharts() {
  for (const c of live) c.fit();
}

function axisStyle(t) {
  return {
    stroke: t.axis,
    grid: { stroke: t.grid, width: 1 },
    ticks: { stroke: t.grid, width: 1, size: 4 },
    font: `10px ${t.font}`,
    labelFont: `11px ${t.font}`,
  };
}

/**
 * A chart card: header (title, optional controls, PNG button), the plot, and
 * a readout line that shows the exact values under the cursor (or at the last
 * point when the cursor is elsewhere).
 *
 * spec: {
 *   title, subtitle, controls: Node[], height, width,
 *   x: number[], xLabel,
 *   series: [{label, values, color, width, dash, scale, spanGaps, fill, points, reference}],
 *     (reference: a guide line, not data: left out of the note on exact zeros)
 *   bands: [{upper, lower, fill}]        (indices into spec.series)
 *   y: {log, range:[min,max], label, format},
 *   y2: {range, format, label}           (second axis on the right, scale "y2")
 *   readout: (idx) => string | Node       (idx = data index, null when none)
 *   draw: (u) => void                     (custom canvas drawing after series)
 *   onHover: (u, idx) => void, onClick: (u, idx, event) => void
 *   legend: [[label, color], ...]         (static legend shown in the header)
 *   name: file name for the PNG export
 * }
 */
/** A line under chart element ``el`` naming the points it cannot draw because their values
 * are exactly 0; nothing when there are none. */
export function zeroNote(el, zeroPoints, points, why) {
  if (!el || !zeroPoints) return;
  const where = zeroPoints === points ? "At every point" : `At ${zeroPoints} of ${points} points`;
  el.append(h("p.zero-note", `${where} ${why}.`));
}

export function chart(parent, spec) {
  const t = theme();
  const el = h("div.chart", { dataset: { chart: spec.name || spec.title || "chart" } });
  const tools = h("div.chart-tools", spec.controls || [],
    h("button.png", { title: "Save this chart as PNG", type: "button", on: { click: () => handle.exportPNG() } }, "PNG"));
  // Panels put the tools in their own header row (spec.toolsIn), so the
  // button never covers an axis label.
  const header = h("div.chart-head", h("div.chart-title", spec.title || ""), spec.toolsIn ? null : tools);
  if (spec.toolsIn) spec.toolsIn.prepend(tools);
  // One line, the full text on hover: rows of charts stay aligned.
  const sub = spec.subtitle ? h("div.chart-sub", { title: spec.subtitle }, spec.subtitle) : null;
  const legend = spec.legend && spec.legend.length
    ? h("div.chart-legend", spec.legend.map(([label, color]) =>
      h("span.key", h("i", { style: { background: color } }), label)))
    : null;
  const plot = h("div.chart-plot");
  const readout = h("div.readout", { "aria-live": "off" });
  el.append(header, sub || "", legend || "", plot, readout);
  parent.append(el);

  const width = spec.width || Math.max(160, plot.clientWidth || parent.clientWidth || 300);
  const height = spec.height || 180;
  const yLog = !!(spec.y && spec.y.log);

  const data = [spec.x];
  const series = [{ label: spec.xLabel || "step" }];
  // Band edges are drawn by drawBands (below), not as uPlot series: uPlot
  // would stroke each invisible edge and fill every band through clip paths,
  // which dominated the cost of a 200-panel grid. They stay series so that
  // the y range and the readout see them.
  const edges = new Set();
  for (const b of spec.bands || []) edges.add(b.upper).add(b.lower);
  for (const [i, s] of spec.series.entries()) {
    const scale = s.scale || "y";
    const values = yLog && scale === "y" ? positiveOnly(s.values) : s.values;
    data.push(values);
    series.push({
      label: s.label,
      scale,
      stroke: s.color || t.line,
      width: s.width ?? 1.25,
      dash: s.dash,
      fill: s.fill,
      spanGaps: !!s.spanGaps,
      points: { show: s.points ?? false, size: 4, fill: s.color },
      show: s.show ?? true,
      ...(edges.has(i) && !(s.width > 0) ? { paths: noPaths } : {}),
    });
  }
  const bands = (spec.bands || []).map((b) => ({ upper: b.upper + 1, lower: b.lower + 1, fill: b.fill }));

  const yFmt = (spec.y && spec.y.format) || tick;
  const axes = [
    { ...axisStyle(t), values: (u, splits) => splits.map(tick), size: 28, space: 60 },
    {
      ...axisStyle(t),
      scale: "y",
      values: (u, splits) => splits.map((v) => yFmt(v)),
      size: (spec.y && spec.y.size) ?? 46,
      label: spec.y && spec.y.label,
      labelSize: spec.y && spec.y.label ? 14 : 0,
    },
  ];
  const scales = {
    x: { time: false },
    y: yLog
      ? { distr: 3, log: 10, range: logRange(spec.y.range) }
      : { ...(spec.y && spec.y.range ? { range: spec.y.range } : {}) },
  };
  if (yLog) {
    // Bounded ticks for any range (see logSplits); about one per 30 px.
    axes[1].splits = (u, i, min, max) => logSplits(min, max, Math.max(2, Math.floor((u.bbox.height / devicePixelRatio) / 30)));
  }
  if (spec.y2) {
    scales.y2 = { range: spec.y2.range };
    axes.push({
      ...axisStyle(t),
      scale: "y2",
      side: 1,
      grid: { show: false },
      values: (u, splits) => splits.map((v) => (spec.y2.format || tick)(v)),
      size: 46,
      label: spec.y2.label,
      labelSize: spec.y2.label ? 14 : 0,
    });
  }

  let lastIdx = -1;
  const showReadout = (idx) => {
    if (idx === lastIdx) return;
    lastIdx = idx;
    const content = spec.readout ? spec.readout(idx) : "";
    readout.textContent = "";
    if (content instanceof Node) readout.append(content);
    else readout.textContent = content || "";
  };

  const opts = {
    width,
    height,
    pxAlign: 0,
    legend: { show: false },
    cursor: {
      points: { show: false },
      drag: { x: true, y: false, setScale: true },
      focus: { prox: -1 },
    },
    focus: { alpha: 1 },
    scales,
    axes,
    series,
    hooks: {
      // Under the lines, over the grid.
      drawAxes: bands.length ? [(uu) => drawBands(uu, bands)] : [],
      draw: spec.draw ? [spec.draw] : [],
      setCursor: [
        (u) => {
          const idx = u.cursor.idx;
          showReadout(idx == null ? lastPoint(u) : idx);
          if (spec.onHover) spec.onHover(u, idx);
        },
      ],
    },
  };
  const u = new uPlot(opts, data, plot);
  if (spec.onZoom) {
    // uPlot calls setScale for drag-zooms and for the double-click reset;
    // report only zooms into a sub-range of the data.
    const full = [spec.x[0], spec.x[spec.x.length - 1]];
    u.hooks.setScale = [(uu, key) => {
      if (key !== "x") return;
      const { min, max } = uu.scales.x;
      if (min > full[0] || max < full[1]) spec.onZoom(uu, min, max);
    }];
  }
  if (spec.onClick) {
    u.over.addEventListener("click", (e) => {
      if (u.cursor.idx != null) spec.onClick(u, u.cursor.idx, e);
    });
    u.over.style.cursor = "pointer";
  }
  u.over.addEventListener("mouseleave", () => showReadout(lastPoint(u)));
  // Double-click restores the full x range after a drag-zoom (uPlot default),
  // we only make sure the readout follows.
  showReadout(lastPoint(u));

  if (yLog) {
    // Points where every value is exactly 0 (a dead layer's update, a gradient that never
    // arrives): no place on a log axis, so the chart says they are there.
    const ys = spec.series.filter((s) => (s.scale || "y") === "y" && !s.reference)
      .map((s) => s.values);
    const zeros = spec.x.filter((_, i) => ys.some((v) => v[i] === 0)
      && ys.every((v) => !(v[i] > 0) || !Number.isFinite(v[i]))).length;
    zeroNote(el, zeros, spec.x.length, "every value is exactly 0, which has no place on a log axis");
  }

  const handle = {
    el,
    u,
    readout,
    fit() {
      const w = plot.clientWidth;
      if (w > 0 && Math.abs(w - u.width) > 2) u.setSize({ width: w, height: u.height });
    },
    destroy() {
      live.delete(handle);
      tools.remove();
      u.destroy();
    },
    exportPNG() {
      exportPNG(u, spec.title || "chart", spec.legend, spec.name || spec.title);
    },
  };
  live.add(handle);
  return handle;
}

function noPaths() {
  return null;
}

/**
 * The y range of a log chart: the spec's (array or function) or uPlot's own
 * magnitude-rounded data range, always passed through safeLogRange.
 */
function logRange(range) {
  return (u, dataMin, dataMax) => {
    let r;
    if (typeof range === "function") r = range(u, dataMin, dataMax);
    else if (Array.isArray(range)) r = range;
    else if (dataMin != null && dataMax != null && dataMin > 0 && dataMax > 0) r = uPlot.rangeLog(dataMin, dataMax, 10, false);
    else r = [dataMin, dataMax];
    return safeLogRange(r[0], r[1]);
  };
}

/**
 * Fills each band between its upper and lower series. Points that fall in
 * the same pixel column are merged (highest upper, lowest lower), so the
 * envelope is exact at any density and the cost is bounded by the width.
 * Missing points (null) split a band: NaN steps stay visible gaps.
 */
function drawBands(u, bands) {
  const ctx = u.ctx;
  const { left, top, width, height } = u.bbox;
  const xs = u.data[0];
  const { min, max } = u.scales.x;
  if (min == null || max == null) return;
  let i0 = 0;
  while (i0 < xs.length && xs[i0] < min) i0++;
  let i1 = xs.length - 1;
  while (i1 > i0 && xs[i1] > max) i1--;
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, width, height);
  ctx.clip();
  for (const b of bands) {
    const hi = u.data[b.upper];
    const lo = u.data[b.lower];
    const yKey = u.series[b.upper].scale;
    // Edges that bridge gaps (e.g. per-epoch bands on a per-step x axis) skip
    // missing points; other bands break there, so NaN steps stay gaps.
    const bridge = u.series[b.upper].spanGaps && u.series[b.lower].spanGaps;
    ctx.fillStyle = b.fill;
    let upX = [];
    let upY = [];
    let loY = [];
    const flush = () => {
      if (upX.length) {
        ctx.beginPath();
        ctx.moveTo(upX[0], upY[0]);
        for (let k = 1; k < upX.length; k++) ctx.lineTo(upX[k], upY[k]);
        for (let k = upX.length - 1; k >= 0; k--) ctx.lineTo(upX[k], loY[k]);
        ctx.closePath();
        ctx.fill();
      }
      upX = [];
      upY = [];
      loY = [];
    };
    for (let j = Math.max(0, i0 - 1); j <= Math.min(xs.length - 1, i1 + 1); j++) {
      const a = hi[j];
      const c = lo[j];
      if (a == null || c == null) {
        if (!bridge) flush();
        continue;
      }
      const px = Math.round(u.valToPos(xs[j], "x", true));
      const pa = u.valToPos(a, yKey, true);
      const pc = u.valToPos(c, yKey, true);
      const k = upX.length - 1;
      if (k >= 0 && upX[k] === px) {
        // Canvas y grows downwards: the band's top is the smaller y.
        upY[k] = Math.min(upY[k], pa);
        loY[k] = Math.max(loY[k], pc);
      } else {
        upX.push(px);
        upY.push(pa);
        loY.push(pc);
      }
    }
    flush();
  }
  ctx.restore();
}

/** Index of the last point with any non-null value (readout when not hovering). */
function lastPoint(u) {
  const n = u.data[0].length;
  for (let i = n - 1; i >= 0; i--) {
    for (let s = 1; s < u.data.length; s++) if (u.data[s][i] != null) return i;
  }
  return n ? n - 1 : null;
}

/**
 * Percentile-band series for `quantiles` (ascending) with values per
 * quantile: symmetric pairs become bands, darker towards the median, and the
 * median is a line (the article's value/magnitude distribution plots).
 */
export function percentileBands(quantiles, rows, color, labelFn = (q) => `p${q}`) {
  const t = theme();
  const n = quantiles.length;
  const series = quantiles.map((q, i) => ({
    label: labelFn(q),
    values: rows[i],
    color: "transparent",
    width: 0,
  }));
  const bands = [];
  const pairs = Math.floor(n / 2);
  for (let i = 0; i < pairs; i++) {
    // Outer pairs lighter; the innermost pair darkest.
    const alpha = 0.16 + (0.5 * (i + 1)) / pairs;
    bands.push({ upper: n - 1 - i, lower: i, fill: t.alpha(color, Math.min(alpha, 0.8) * 0.6) });
  }
  if (n % 2 === 1) {
    const mid = (n - 1) / 2;
    series[mid] = { ...series[mid], color, width: 1.5 };
  }
  return { series, bands };
}

// Sequential ramp for the stack bands, input (light green) to output (indigo):
// neighbouring layers get neighbouring colours, so depth reads off the colour,
// and it stays legible on the light and the dark theme. The hover colour
// (orange) is outside the ramp.
const DEPTH_RAMP = ["#b8e186", "#5ab4ac", "#3b82c4", "#4a4fa8"];

/** `n` colours along the depth ramp, first = nearest the input. */
export function depthColors(n) {
  const rgb = DEPTH_RAMP.map((c) => [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16)));
  const out = [];
  for (let i = 0; i < n; i++) {
    const p = n > 1 ? (i / (n - 1)) * (rgb.length - 1) : 0;
    const k = Math.min(Math.floor(p), rgb.length - 2);
    const f = p - k;
    const c = rgb[k].map((a, j) => Math.round(a + (rgb[k + 1][j] - a) * f));
    out.push(`#${c.map((v) => v.toString(16).padStart(2, "0")).join("")}`);
  }
  return out;
}

/**
 * Stack plot of per-layer fractions, first row at the bottom, one colour per
 * band (the article's layer-scale stack plot). Drawn in a uPlot draw hook so
 * axes, zoom and cursor behave like every other chart. colors: {bands: one
 * colour per row (cycled when shorter), highlight, separator}.
 */
export function stackDrawer(x, rows, { colors, highlight }) {
  const n = x.length;
  const cum = [];
  let prev = new Float64Array(n);
  for (const row of rows) {
    const next = new Float64Array(n);
    for (let j = 0; j < n; j++) next[j] = prev[j] + (row[j] || 0);
    cum.push(next);
    prev = next;
  }
  const state = { hover: -1, focus: highlight ?? -1 };
  function layerAt(idx, yVal) {
    if (idx == null || yVal == null) return -1;
    let below = 0;
    for (let i = 0; i < cum.length; i++) {
      const top = cum[i][idx];
      if (yVal >= below && yVal < top) return i;
      below = top;
    }
    return -1;
  }
  function draw(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    const px = new Float64Array(n);
    for (let j = 0; j < n; j++) px[j] = u.valToPos(x[j], "x", true);
    const yPos = (v) => u.valToPos(v, "y", true);
    let lower = null;
    for (let i = 0; i < cum.length; i++) {
      const upper = cum[i];
      ctx.beginPath();
      ctx.moveTo(px[0], yPos(upper[0]));
      for (let j = 1; j < n; j++) ctx.lineTo(px[j], yPos(upper[j]));
      for (let j = n - 1; j >= 0; j--) ctx.lineTo(px[j], yPos(lower ? lower[j] : 0));
      ctx.closePath();
      ctx.fillStyle = i === state.hover || i === state.focus
        ? colors.highlight : colors.bands[i % colors.bands.length];
      ctx.fill();
      lower = upper;
    }
    // A hairline between bands: neighbours on the ramp are close in colour.
    // Not when bands average under 3 device pixels: the background-coloured
    // lines would cover the fills (155 layers of MobileNetV2 drew a blank plot).
    if (colors.separator && cum.length > 1 && height / cum.length >= 3) {
      ctx.strokeStyle = colors.separator;
      ctx.lineWidth = Math.max(1, (window.devicePixelRatio || 1) * 0.6);
      for (let i = 0; i < cum.length - 1; i++) {
        ctx.beginPath();
        ctx.moveTo(px[0], yPos(cum[i][0]));
        for (let j = 1; j < n; j++) ctx.lineTo(px[j], yPos(cum[i][j]));
        ctx.stroke();
      }
    }
    ctx.restore();
  }
  return { draw, layerAt, state, cum };
}

/** Renders a chart to a PNG file with a title and legend, and downloads it. */
export function exportPNG(u, title, legend, name) {
  const t = theme();
  const dpr = window.devicePixelRatio || 1;
  const src = u.ctx.canvas;
  const pad = 10 * dpr;
  const titleH = 22 * dpr;
  const legendH = legend && legend.length ? 18 * dpr : 0;
  const canvas = document.createElement("canvas");
  canvas.width = src.width + 2 * pad;
  canvas.height = src.height + titleH + legendH + 2 * pad;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = t.bg;
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = t.text;
  ctx.font = `${13 * dpr}px ${t.font}`;
  ctx.textBaseline = "top";
  ctx.fillText(title, pad, pad);
  let lx = pad;
  if (legendH) {
    ctx.font = `${11 * dpr}px ${t.font}`;
    for (const [label, color] of legend) {
      ctx.fillStyle = color;
      ctx.fillRect(lx, pad + titleH + 2 * dpr, 10 * dpr, 10 * dpr);
      ctx.fillStyle = t.text;
      ctx.fillText(label, lx + 14 * dpr, pad + titleH);
      lx += ctx.measureText(label).width + 30 * dpr;
    }
  }
  ctx.drawImage(src, pad, pad + titleH + legendH);
  canvas.toBlob((blob) => {
    if (!blob) return;
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: `${safeFileName(name || title)}.png` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }, "image/png");
}

function safeFileName(s) {
  return String(s).replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^_+|_+$/g, "").slice(0, 80) || "chart";
}

/** Formats a readout row: "label value" pairs separated by thin gaps. */
export function readoutLine(head, pairs, warn) {
  const line = h("span.ro");
  if (head) line.append(h("b", head));
  for (const [label, value, color] of pairs) {
    line.append(h("span.pair", color ? h("i.sw", { style: { background: color } }) : null,
      h("span.k", label), " ", h("span.v", typeof value === "number" || value == null ? fmt(value) : value)), " ");
  }
  if (warn) line.append(h("span.warn", warn));
  return line;
}

/** Resolves after uPlot's microtask commit and one frame: the charts are on screen. */
export function afterPaint() {
  return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
}
