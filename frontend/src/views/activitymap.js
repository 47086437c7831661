// "Per-channel and spatial activity" section of the Activity view (layer
// outputs): for one layer and one epoch, the histogram of per-channel
// activation rates and, for outputs with spatial positions, the heat map of
// the per-position rate and the alive/dead map (the toolkit's
// plot_channel_stats and plot_spatial_stats), from ./activity.
//
// The alive/dead positions are a second map beside the heat map rather than
// outlines on it: at 112×112 positions a cell is 2 px, too small to outline,
// and on the colour scale a dead 0 % is hardly darker than 2 %; two maps of
// equal size keep every position at the same place in both.

import { exportPNG } from "../charts.js";
import { emptyNote, shapeText } from "../common.js";
import { clear, h } from "../dom.js";
import { pct } from "../format.js";
import { aliveColor, cellAt, cellSize, drawCells, gridOf, mixHex, rateColor, scaleGradient } from "../heatmap.js";
import { barAt, barText, drawHistogram, rateStats, statsLine } from "../histogram.js";
import { CHARTS } from "../schema.js";
import { theme } from "../theme.js";

/** The section's title and help: the schema's definition of the ACTIVITY_MAP slots. */
const MAPS = CHARTS["activity.maps"];
const HIST_W = 440;
const HIST_H = 210;

/** A rate as a percentage that never shows a live 3e-7 as "0.0%" or 0.9999997 as "100.0%". */
export function ratePct(v) {
  if (v == null || !Number.isFinite(v)) return "—";
  if (v > 0 && v < 0.0005) return "<0.1%";
  if (v < 1 && v > 0.9995) return ">99.9%";
  return pct(v);
}

/** The map opened first: the highest final dead rate (first in depth order on a tie), else the first. */
export function defaultMap(maps) {
  let best = maps[0];
  for (const m of maps) if ((m.final_dead_rate ?? 0) > (best.final_dead_rate ?? 0)) best = m;
  return best;
}

function mapLabel(m) {
  const sp = m.spatial_shape && m.spatial_shape.length ? ` · ${m.spatial_shape.join("×")}` : "";
  const dead = m.final_dead_rate > 0 ? ` · dead ${pct(m.final_dead_rate)}` : "";
  return `${m.name} (${m.channels} ch${sp}${dead})`;
}

function card(name, title, onPNG) {
  const readout = h("div.readout", { "aria-live": "off" });
  const tools = h("div.chart-tools", h("button.png", { type: "button", title: "Save this chart as PNG", on: { click: onPNG } }, "PNG"));
  const el = h("div.chart.amap-card", { dataset: { chart: name } }, h("div.chart-head", h("div.chart-title", title), tools));
  return { el, readout };
}

/**
 * Renders the section into `parent` for run document `info` (./run); resolves
 * once the first layer's map is drawn (or the section says why there is none).
 */
export async function renderActivityMaps(ctx, parent, info) {
  const maps = info.activity || [];
  const section = h("section.amap", { dataset: { state: "loading" } },
    h("h2", `${MAPS.title} `, h("span.h-help", MAPS.help)));
  parent.append(section);
  if (!maps.length) {
    section.dataset.state = "none";
    section.append(emptyNote(`No activity maps in run “${info.run}”.`,
      "They are logged once per epoch for layer outputs by tb-introspect with format version 2 or later"
      + (info.format_version && info.format_version < 2 ? ` (this run has format version ${info.format_version})` : "") + "."));
    return;
  }
  const byName = new Map(maps.map((m) => [m.name, m]));
  let current = byName.get(ctx.state.alayer) || defaultMap(maps);
  let doc = null;
  let index = 0;

  const select = h("select.amap-layer", { "aria-label": "layer of the activity map" },
    maps.map((m) => h("option", { value: m.name, selected: m === current }, mapLabel(m))));
  const slider = h("input.amap-epoch", { type: "range", min: 0, max: 0, step: 1, value: 0, "aria-label": "epoch" });
  const prev = h("button.amap-prev", { type: "button", title: "previous epoch", "aria-label": "previous epoch" }, "◀");
  const next = h("button.amap-next", { type: "button", title: "next epoch", "aria-label": "next epoch" }, "▶");
  const epochLabel = h("span.amap-epoch-label");
  const body = h("div.amap-body");
  section.append(
    h("div.amap-controls",
      h("label.ctl", "Layer ", select),
      h("span.ctl.amap-stepper", "Epoch ", prev, slider, next, epochLabel)),
    body);

  const t = theme();
  // Alive is the usual state: a light tint of the activation colour, so the dead (red) cells stand out.
  const alive = mixHex(t.active, t.bg, 0.5);
  let view = null; // the drawn cards of the current layer

  const setEpoch = (i) => {
    if (!doc) return;
    index = Math.max(0, Math.min(doc.epochs.length - 1, i));
    slider.value = String(index);
    draw();
    const last = index === doc.epochs.length - 1;
    ctx.setState({ aepoch: last ? "" : String(doc.epochs[index]) }, { render: false });
  };
  slider.addEventListener("input", () => setEpoch(Number(slider.value)));
  prev.addEventListener("click", () => setEpoch(index - 1));
  next.addEventListener("click", () => setEpoch(index + 1));

  async function load(m) {
    current = m;
    section.dataset.state = "loading";
    section.dataset.layer = m.name;
    const got = await ctx.api.activity(info.run, m.tag);
    if (!ctx.alive() || current !== m) return;
    doc = got;
    const n = doc.epochs.length;
    const want = ctx.state.aepoch === "" ? -1 : doc.epochs.indexOf(Number(ctx.state.aepoch));
    index = want >= 0 ? want : n - 1;
    slider.max = String(Math.max(0, n - 1));
    slider.value = String(index);
    slider.disabled = n <= 1;
    view = build(doc);
    clear(body).append(...view.nodes);
    draw();
    section.dataset.state = "ready";
  }

  function build(d) {
    const nodes = [];
    const hist = card("amap-hist", "Per-channel activation rate", () =>
      // The summary line goes into the PNG as its legend, in its colour.
      exportPNG({ ctx: histCanvas.getContext("2d") }, `${d.name}, epoch ${d.epochs[index]}: channel rates`,
        [[overlay.textContent, { ok: t.active, some: t.spatial, all: t.dead }[overlay.dataset.level]]], `activity-channels-${d.name}`));
    const histCanvas = h("canvas.amap-hist-canvas", { role: "img" });
    const overlay = h("div.amap-overlay");
    hist.el.append(overlay, h("div.amap-plot", histCanvas), hist.readout);
    nodes.push(hist.el);
    const v = { nodes, hist, histCanvas, overlay, layout: null, stats: null, hover: null };
    histCanvas.addEventListener("mousemove", (e) => {
      const bar = v.layout ? barAt(v.layout, e.offsetX) : null;
      if (bar !== v.hover) {
        v.hover = bar;
        drawHist();
      }
    });
    histCanvas.addEventListener("mouseleave", () => {
      v.hover = null;
      drawHist();
    });
    if (d.positions > 0) {
      v.grid = gridOf(d.spatial_shape, d.positions);
      v.cell = cellSize(v.grid);
      const strip = v.grid.strip;
      const where = (c) => (strip ? `position ${c.col}` : `row ${c.row}, col ${c.col}`);
      const mapCard = (name, title, legend, colorOf, text, keys) => {
        const canvas = h("canvas.amap-map", { role: "img" });
        const c = card(name, title, () =>
          exportPNG({ ctx: canvas.getContext("2d") }, `${d.name}, epoch ${d.epochs[index]}`, keys(), `${name}-${d.name}`));
        c.el.append(h("div.chart-sub", `${shapeText(d.spatial_shape)} positions${strip ? " (a sequence: one row)" : ", row-major"}`),
          h("div.amap-canvas-box", canvas), legend, c.readout);
        const idle = () => (c.readout.textContent = text());
        canvas.addEventListener("mousemove", (e) => {
          const cell = cellAt(canvas, v.grid, e);
          if (!cell) return idle();
          const r = d.spatial_rates[index][cell.index];
          c.readout.textContent = `${where(cell)}: ${r == null ? "not logged" : r === 0 ? "dead (0%)" : ratePct(r)}`;
        });
        canvas.addEventListener("mouseleave", idle);
        nodes.push(c.el);
        return { canvas, colorOf, idle };
      };
      const scale = h("div.amap-scale", h("span", "0%"), h("i.amap-ramp", { style: { background: scaleGradient() } }), h("span", "100%"));
      v.heat = mapCard("amap-heat", "Activation rate per position", scale, rateColor, () => {
        const s = rateStats(d.spatial_rates[index]);
        return s.n ? `mean ${ratePct(s.mean)} · min ${ratePct(s.min)} · max ${ratePct(s.max)}` : "not logged";
      }, () => [0, 0.5, 1].map((r) => [pct(r, 0), `rgb(${rateColor(r).join(",")})`]));
      const aliveKeys = h("div.chart-legend");
      v.alive = mapCard("amap-alive", "Alive and dead positions", aliveKeys, aliveColor(alive, t.dead), () => {
        const s = rateStats(d.spatial_rates[index]);
        return s.n ? `${s.dead} of ${s.n} positions dead (${pct(s.dead / s.n)})` : "not logged";
      }, () => [["alive (rate > 0)", alive], ["dead (0)", t.dead]]);
      v.aliveKeys = aliveKeys;
    } else {
      nodes.push(h("p.hint.amap-nospatial",
        `Dense output (${shapeText(d.shape)}): no spatial positions, so no spatial map.`));
    }
    return v;
  }

  function drawHist() {
    const v = view;
    v.layout = drawHistogram(v.histCanvas, v.stats, { width: HIST_W, height: HIST_H, theme: t, hover: v.hover });
    v.hist.readout.textContent = v.hover == null
      ? "hover a bar for its channel count"
      : barText(v.stats, v.hover);
  }

  function draw() {
    const v = view;
    const d = doc;
    const samples = d.samples[index];
    epochLabel.textContent = `epoch ${d.epochs[index]} (${index + 1} of ${d.epochs.length}) · step ${d.steps[index]}`
      + (samples != null ? ` · ${Math.round(samples).toLocaleString("en-US")} samples` : "");
    prev.disabled = index <= 0;
    next.disabled = index >= d.epochs.length - 1;
    section.dataset.epoch = String(d.epochs[index]);
    v.stats = rateStats(d.channel_rates[index]);
    const line = statsLine(v.stats);
    v.overlay.textContent = line.text;
    v.overlay.dataset.level = line.level;
    v.histCanvas.setAttribute("aria-label", `histogram of channel activation rates: ${line.text}`);
    drawHist();
    if (v.heat) {
      const rates = d.spatial_rates[index];
      for (const m of [v.heat, v.alive]) {
        drawCells(m.canvas, rates, v.grid, v.cell, m.colorOf, t.grid);
        m.idle();
      }
      const s = rateStats(rates);
      clear(v.aliveKeys).append(
        h("span.key", h("i", { style: { background: alive } }), `alive (rate > 0): ${s.n - s.dead}`),
        h("span.key", h("i", { style: { background: t.dead } }), `dead (0): ${s.dead}`));
      v.heat.canvas.setAttribute("aria-label", `heat map of the activation rate per position: ${v.heat.idle()}`);
    }
  }

  select.addEventListener("change", () => {
    const m = byName.get(select.value);
    if (!m) return;
    ctx.setState({ alayer: m.name }, { render: false });
    load(m).catch((e) => showError(e));
  });
  const showError = (e) => {
    if (!ctx.alive()) return;
    section.dataset.state = "error";
    clear(body).append(h("p.error", `Could not load the activity map: ${e.message}`));
  };
  try {
    await load(current);
  } catch (e) {
    showError(e);
  }
}
