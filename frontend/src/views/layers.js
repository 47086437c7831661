// Layers: every monitored tensor of one view in a compact grid, first layer
// first. Per panel a mode switch (the table in ../modes.js): value percentiles
// (linear axis), magnitude percentiles (log10 axis, sign balance and zero
// fraction on a second axis), RMS, a view's own slot (update ratio, gradient
// cosine), or the weights' implicit-learning-rate percentiles (log axis).

import { exportURL } from "../api.js";
import { afterPaint, chart, percentileBands, readoutLine, zeroNote } from "../charts.js";
import { VIEW_LABELS, compileFilter, emptyNote, pointLabel, sampleBudget, sampleNote, shapeText, xValues } from "../common.js";
import { h } from "../dom.js";
import { pct } from "../format.js";
import { theme } from "../theme.js";
import { LazyDrawer } from "../lazy.js";
import { defaultMode, fieldsFor, mode as modeInfo, modesFor, modesOfView } from "../modes.js";
import { NONFINITE_FIELDS, SLOT_LABELS } from "../schema.js";
import { ilrField, quantileField as qField } from "../slots.js";
import { overviewEpochMap } from "./shared.js";

// What one point of an aggregated cadence covers (the panel's tag says which).
const AGGREGATED = { epoch: "per epoch", window: "per window of steps" };

// Browsers open at most 6 HTTP/1.1 connections per host (TensorBoard's server
// closes each after one response): split the tensors into at most that many
// requests, so none waits for a free connection.
const PARALLEL = 6;
const chunkSize = (n) => Math.max(10, Math.ceil(n / PARALLEL));

/** The mode a panel opens in; `ovView`: the view's `./overview` entry (what the run logged). */
export function modeOf(state, view, tensor, ovView) {
  const ok = modesFor(tensor, ovView);
  for (const m of [state.modes[tensor.tag], state.lmode]) if (m && ok.includes(m)) return m;
  return defaultMode(view);
}

/**
 * Fields a panel needs. The non-finite counts are only asked for when the
 * overview saw non-finite values in this view (it sums them over all
 * tensors and steps): on a healthy run they are all zero and would only add
 * three columns to every request.
 */
function panelFields(mode, quantiles, withNonfinite) {
  return fieldsFor(mode, quantiles, withNonfinite ? NONFINITE_FIELDS : []);
}

/**
 * Points per panel: about one per pixel column of the plot. More cannot be
 * seen and only cost transfer and parsing time (1,000-step runs x 200
 * panels). The server keeps the first and last point and spreads the rest
 * evenly; a drag-zoom on a panel re-reads that panel at full resolution.
 */
function pointBudget(width) {
  return Math.max(200, Math.ceil(width));
}

export async function renderLayers(ctx) {
  const { api, state, root } = ctx;
  // The overview comes from the same server-side read as the run listing.
  const [info, ov] = await Promise.all([api.run(state.run), api.overview(state.run)]);
  if (!ctx.alive()) return;
  const view = state.view;
  const all = info.views[view] || [];
  const filter = compileFilter(state.filter);
  const tensors = all.filter(filter.test);
  const ovView = ov.views && ov.views[view];
  const head = h("div.view-head",
    h("h2", `${VIEW_LABELS[view]}: ${tensors.length} of ${all.length} tensors`),
    modeAllSwitch(ctx, view, ovView));
  root.append(head);
  if (!all.length) {
    root.append(emptyNote(`No ${VIEW_LABELS[view].toLowerCase()} statistics were logged in run “${state.run}”.`,
      "Pick another view above, or turn this view on in the writer."));
    return;
  }
  if (!tensors.length) {
    root.append(emptyNote(`No tensor name matches the filter “${state.filter}”.`));
    return;
  }
  const grid = h("div.grid");
  root.append(grid);
  const L = {
    ctx,
    view,
    ovView,
    width: 0,
    // One step -> epoch map for every panel, from the run's overview.
    epochMap: overviewEpochMap(ov),
    nonfinite: !ovView || !ovView.nonfinite || ovView.nonfinite.some((c) => c),
    budget: 0,
  };
  const panels = tensors.map((t) => panel(L, t));
  grid.append(...panels.map((p) => p.el));
  L.width = Math.max(180, panels[0].plot.clientWidth);
  L.budget = pointBudget(L.width);
  L.lazy = new LazyDrawer((p) => drawPanel(L, p, p.series), () => ctx.markComplete());
  ctx.onCleanup(() => L.lazy.stop());
  for (const p of panels) L.lazy.watch(p);

  const focus = panels.find((p) => p.tensor.tag === state.focus);
  if (focus) {
    focus.el.classList.add("focused");
    focus.el.scrollIntoView({ block: "center" });
  }

  // The panels on (or next to) the screen are read first, in one request; the first
  // screen is ready when they are drawn. The others follow in chunks, drawn as their data
  // arrives (near the viewport) or in idle time (lazy.js).
  await L.lazy.firstCallback;
  if (!ctx.alive()) return;
  const near = panels.filter((p) => p.near);
  await loadAndDraw(L, near);
  if (!ctx.alive()) return;
  // Not `!p.near`: panels move while the first ones load, and a panel read twice would
  // be queued again after it was drawn.
  const first = new Set(near);
  const rest = panels.filter((p) => !first.has(p));
  const size = chunkSize(rest.length);
  const jobs = [];
  for (let i = 0; i < rest.length; i += size) jobs.push(loadAndDraw(L, rest.slice(i, i + size)));
  Promise.all(jobs).catch((e) => ctx.alive() && ctx.status(`Could not load every panel: ${e.message}`, "error"));
  await L.lazy.drawNear();
  if (focus && ctx.alive()) focus.el.scrollIntoView({ block: "center" });
  await afterPaint();
}

async function loadAndDraw(L, part) {
  const { ctx, view } = L;
  // Group by (mode, quantile layout): one request per group.
  const groups = new Map();
  for (const p of part) {
    const fields = panelFields(p.mode, p.tensor.quantiles || [], L.nonfinite);
    const downsample = sampleBudget(p.tensor, L.budget);
    const key = `${fields.join(",")}|${downsample}`;
    if (!groups.has(key)) groups.set(key, { fields, downsample, panels: [] });
    groups.get(key).panels.push(p);
  }
  await Promise.all([...groups.values()].map(async (g) => {
    const series = await ctx.api.series(ctx.state.run, g.panels.map((p) => p.tensor.tag), g.fields,
      { downsample: g.downsample, chunk: g.panels.length });
    if (!ctx.alive()) return;
    for (const p of g.panels) {
      const s = series[p.tensor.tag];
      if (!s) continue;
      p.series = s;
      L.lazy.ready(p);
    }
  }));
}

function modeAllSwitch(ctx, view, ovView) {
  const current = ctx.state.lmode || "";
  const btn = (mode, label) => h(`button.seg${current === mode ? ".on" : ""}`, {
    dataset: { mode },
    type: "button",
    title: mode ? `Show every panel as ${modeInfo(mode).help}` : "Each view's default: values for weights/outputs, magnitudes for gradients",
    on: { click: () => ctx.setState({ lmode: mode, modes: {} }) },
  }, label);
  return h("div.segmented", { role: "group", "aria-label": "mode of all panels" },
    h("span.seg-label", "all panels:"), btn("", "default"), modesOfView(view, ovView).map((m) => btn(m, modeInfo(m).label)));
}

function panel(L, t) {
  const { ctx, view } = L;
  const mode = modeOf(ctx.state, view, t, L.ovView);
  const switcher = h("div.segmented.small", { role: "group", "aria-label": "chart mode" },
    modesFor(t, L.ovView).map((m) => [m, modeInfo(m).label]).map(([m, label]) => h(`button.seg${m === mode ? ".on" : ""}`, {
      type: "button",
      title: modeInfo(m).help,
      dataset: { mode: m },
      on: { click: () => switchMode(L, p, m) },
    }, label)));
  // Until its data is drawn, a panel says that it is loading (not an empty chart).
  const plot = h("div.panel-plot", h("div.panel-loading", "loading…"));
  // Line 1: the name (and the PNG button); line 2: the shape and the mode
  // switch. Layer and dtype are in the tooltip: the name already says them.
  const tools = h("div.panel-tools",
    ["csv", "json"].map((format) => h("a.export", {
      href: exportURL(ctx.state.run, t.tag, format),
      download: "",
      title: `Download every point of this tensor (step, epoch and every statistic) as ${format.toUpperCase()}`,
    }, format.toUpperCase())));
  const meta = h("div.panel-meta", {
    title: [t.layer ? `layer ${t.layer}` : "", t.dtype || "", AGGREGATED[t.cadence] ? `logged ${AGGREGATED[t.cadence]}` : ""]
      .filter(Boolean).join(" · "),
  },
  h("span.shape", `shape ${shapeText(t.shape)}`),
  AGGREGATED[t.cadence] ? ` · ${AGGREGATED[t.cadence]}` : "");
  const el = h("div.panel", { dataset: { tag: t.tag, mode, state: "loading" } },
    h("div.panel-head", h("div.panel-name", { title: t.tag }, t.name), tools),
    h("div.panel-bar", meta, switcher),
    plot);
  const p = { el, plot, meta, switcher, tools, tensor: t, mode, chart: null, full: false };
  return p;
}

/** Redraws one panel in another mode; only this panel's data is fetched. */
async function switchMode(L, p, mode) {
  if (mode === p.mode) return;
  const { ctx } = L;
  ctx.setState({ modes: { ...ctx.state.modes, [p.tensor.tag]: mode } }, { render: false });
  p.mode = mode;
  p.el.dataset.mode = mode;
  for (const b of p.switcher.querySelectorAll("button")) b.classList.toggle("on", b.dataset.mode === mode);
  await reload(L, p, p.full ? 0 : panelDownsample(L, p));
}

function panelDownsample(L, p) {
  return sampleBudget(p.tensor, L.budget);
}

/** Fetches and redraws one panel (mode switch, or full resolution after a zoom). */
async function reload(L, p, downsample, xRange) {
  const { ctx } = L;
  const mode = p.mode;
  const fields = panelFields(mode, p.tensor.quantiles || [], L.nonfinite);
  const series = await ctx.api.series(ctx.state.run, [p.tensor.tag], fields, { downsample });
  if (!ctx.alive() || p.mode !== mode) return;
  if (p.chart) p.chart.destroy();
  p.plot.textContent = "";
  p.series = series[p.tensor.tag];
  drawPanel(L, p, p.series);
  if (xRange && p.chart) p.chart.u.setScale("x", xRange);
}

function nonfiniteText(s, idx) {
  const v = s.values;
  const parts = [];
  if (!v.nan_count) return null;
  for (const f of NONFINITE_FIELDS) {
    const c = v[f] ? v[f][idx] : 0;
    if (c) parts.push(`${SLOT_LABELS[f]} ×${c}`);
  }
  return parts.length ? parts.join(", ") : null;
}

function drawPanel(L, p, s) {
  const { ctx, view, width, epochMap } = L;
  // Which mode is on screen (the switch flips before the data arrives).
  p.el.dataset.drawn = p.mode;
  delete p.el.dataset.state;
  p.plot.querySelector(".panel-loading")?.remove();
  if (!p.sampleNote) {
    p.sampleNote = h("div.sampled");
    p.el.append(p.sampleNote);
  }
  p.sampleNote.textContent = sampleNote(s, p.tensor);
  p.sampled = !!p.sampleNote.textContent;
  const t = theme();
  const color = t.views[view];
  const mode = p.mode;
  const x = xValues(ctx.state.x, s.steps, s.epochs, epochMap);
  const xLabel = ctx.state.x === "epoch" ? "epoch" : "step";
  const qs = s.quantiles || p.tensor.quantiles || [];
  const head = (idx) => pointLabel(s.steps[idx], s.epochs[idx]);
  const common = {
    x, xLabel, width, height: 150, name: `${view}-${p.tensor.name}-${mode}`, toolsIn: p.tools,
    // A drag-zoom on a sampled panel re-reads it at full resolution.
    onZoom: p.sampled ? (u, min, max) => {
      p.full = true;
      reload(L, p, 0, { min, max });
    } : null,
  };
  const title = "";
  const info = modeInfo(mode);
  const slot = info && info.slot;
  if (slot) {
    const v = s.values[slot.field];
    // A dashed reference: the ~1e-3 rule of thumb, or zero cosine.
    const ref = x.map(() => slot.ref);
    p.chart = chart(p.plot, {
      ...common,
      title,
      series: [
        { label: info.label, values: v, color, width: 1.5 },
        { label: slot.refLabel, values: ref, color: t.muted, width: 1, dash: [4, 4], reference: true },
      ],
      y: slot.range ? { range: slot.range } : { log: !!slot.log },
      readout: (idx) => idx == null ? "" : readoutLine(head(idx), [[info.readout, v[idx]]], nonfiniteText(s, idx)),
    });
    // The first point has no previous one: only a series with no value at all is explained.
    if (v && v.every((y) => y == null)) zeroNote(p.chart.el, x.length, x.length, slot.none);
    return;
  }
  if (mode === "rms") {
    const rms = s.values.rms;
    p.chart = chart(p.plot, {
      ...common,
      title,
      series: [{ label: info.readout, values: rms, color, width: 1.5 }],
      y: { log: ctx.state.y === "log" },
      readout: (idx) => idx == null ? "" : readoutLine(head(idx), [[info.readout, rms[idx]]], nonfiniteText(s, idx)),
    });
    return;
  }
  if (mode === "values") {
    const rows = qs.map((q) => s.values[qField(q, false)]);
    const { series, bands } = percentileBands(qs, rows, color, (q) => `${q}%`);
    p.chart = chart(p.plot, {
      ...common,
      title,
      series,
      bands,
      readout: (idx) => idx == null ? "" : readoutLine(head(idx), quantilePairs(qs, rows, idx, ""), nonfiniteText(s, idx)),
    });
    return;
  }
  if (mode === "ilr") {
    drawIlr(p, s, { common, color, qs, head, nonfinite: (idx) => nonfiniteText(s, idx) });
    return;
  }
  // magnitude
  const logRows = qs.map((q) => s.values[qField(q, true)]);
  const zf = s.values.zero_fraction;
  const { rows, floor } = magnitudeRows(qs, logRows, zf);
  const { series, bands } = percentileBands(qs, rows, color, (q) => `|x| ${q}%`);
  // Over the non-zero values (format 2): a ReLU output reads +100 %, its zeros are the grey line.
  series.push({ label: SLOT_LABELS.sign_balance, values: s.values.sign_balance, color: t.sign, width: 1, scale: "y2" });
  if (zf) series.push({ label: SLOT_LABELS.zero_fraction, values: zf, color: t.muted, width: 1, dash: [3, 3], scale: "y2" });
  p.chart = chart(p.plot, {
    ...common,
    title,
    series,
    bands,
    y: { log: true, range: floor ? (u, min, max) => [floor, 10 ** Math.ceil(Math.log10(Math.max(max, floor * 10)))] : undefined },
    y2: { range: [-1, 1], format: (v) => `${v > 0 ? "+" : ""}${Math.round(v * 100)}%` },
    readout: (idx) => {
      if (idx == null) return "";
      const pairs = quantilePairs(qs, rows.map((r) => r.map((v) => (v === floor ? 0 : v))), idx, "|x| ");
      pairs.push([SLOT_LABELS.zero_fraction, pct(zf ? zf[idx] : null), t.muted],
        ["sign", s.values.sign_balance[idx] == null ? "—" : `${s.values.sign_balance[idx] > 0 ? "+" : ""}${pct(s.values.sign_balance[idx])}`, t.sign]);
      return readoutLine(head(idx), pairs, nonfiniteText(s, idx));
    },
  });
  zeroNote(p.chart.el, zf ? zf.filter((z) => z >= 1).length : 0, x.length, "every entry is"
    + " exactly 0 (the dashed zero share at 100%), which has no place on a log axis");
}

/**
 * The implicit learning rate's percentile bands on a log axis. The axis fits
 * the inner percentiles (12.5–87.5 % by default) with a decade to spare: the
 * extremes come from elements whose gradient sum nearly cancels over the
 * window (or whose update rounds to 0 in float32) and reach 1e20 or 0, which
 * would flatten the bands that tell layers apart. They run off the plot's
 * edge; the readout keeps their exact values.
 */
function drawIlr(p, s, { common, color, qs, head, nonfinite }) {
  const rows = qs.map((q) => s.values[ilrField(q)] || common.x.map(() => null));
  const inner = qs.length > 4 ? rows.slice(1, -1) : rows;
  let lo = Infinity;
  let hi = 0;
  for (const r of inner) {
    for (const v of r) {
      if (v != null && v > 0 && Number.isFinite(v)) {
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
  }
  const logged = hi > 0;
  const range = logged ? [10 ** (Math.floor(Math.log10(lo)) - 1), 10 ** (Math.ceil(Math.log10(hi)) + 1)] : undefined;
  // A rate of exactly 0 (the weight did not move) sits below the axis: its band runs off the bottom.
  const drawn = logged ? rows.map((r) => r.map((v) => (v === 0 ? range[0] / 10 : v))) : rows;
  const { series, bands } = percentileBands(qs, drawn, color, (q) => `ILR ${q}%`);
  p.chart = chart(p.plot, {
    ...common,
    title: "",
    series,
    bands,
    y: { log: true, range },
    readout: (idx) => {
      if (!logged) {
        return readoutLine("", [["implicit learning rate", "not logged (needs the gradient view and two logged points)"]]);
      }
      if (idx == null) return "";
      return readoutLine(head(idx), quantilePairs(qs, rows, idx, ""), nonfinite(idx));
    },
  });
}

function quantilePairs(qs, rows, idx, prefix) {
  const want = [0, 25, 50, 75, 100];
  const pairs = [];
  qs.forEach((q, i) => {
    if (qs.length <= 5 || want.includes(q)) {
      const label = q === 0 ? "min" : q === 100 ? "max" : q === 50 ? "median" : `${q}%`;
      pairs.push([prefix + label, rows[i][idx]]);
    }
  });
  return pairs;
}

/**
 * Magnitude percentiles over *all* finite values, zeros included: the writer
 * logs percentiles of log10|x| over the non-zero values plus the zero
 * fraction z. Overall percentile p is 0 when p <= z, else the non-zero
 * percentile at (p - z) / (1 - z), interpolated linearly in log space between
 * the logged points. With z = 0 this is exactly the logged values. Zeros are
 * drawn at a floor one decade below the smallest magnitude so that a band
 * "falls to the bottom" when that share of the tensor is exactly zero.
 */
export function magnitudeRows(qs, logRows, zf) {
  const n = logRows.length ? logRows[0].length : 0;
  let minLog = Infinity;
  for (const r of logRows) for (const v of r) if (v != null && v < minLog) minLog = v;
  const anyZeros = !!zf && zf.some((z) => z != null && z > 0);
  // Kept above 0 (a log axis cannot show 0), also for magnitudes near the double's limit.
  const floor = anyZeros && Number.isFinite(minLog) ? Math.max(10 ** (Math.floor(minLog) - 1), 1e-300) : null;
  const rows = qs.map(() => new Array(n).fill(null));
  for (let j = 0; j < n; j++) {
    const z = zf ? zf[j] ?? 0 : 0;
    for (let i = 0; i < qs.length; i++) {
      const p = qs[i] / 100;
      if (z > 0 && p <= z) {
        rows[i][j] = floor;
        continue;
      }
      let l;
      if (z <= 0) {
        l = logRows[i][j];
      } else {
        const r = ((p - z) / (1 - z)) * 100;
        l = interpolate(qs, logRows, j, r);
      }
      rows[i][j] = l == null ? null : 10 ** l;
    }
  }
  return { rows, floor };
}

function interpolate(qs, logRows, j, r) {
  for (let k = 1; k < qs.length; k++) {
    if (r <= qs[k]) {
      const a = logRows[k - 1][j];
      const b = logRows[k][j];
      if (a == null || b == null) return null;
      const f = (r - qs[k - 1]) / (qs[k] - qs[k - 1]);
      return a + f * (b - a);
    }
  }
  return logRows[qs.length - 1][j];
}

