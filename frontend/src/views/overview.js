// Overview: the one-page dashboard of a run. Loss/metrics with per-epoch
// bands, the findings panel, per view a row of three charts (distribution
// of per-layer RMS, layer-scale stack plot, activation/dead rates), and after
// the weights the implicit learning rate (./ilr.js); under the loss, for a run with
// probes, the Transformer section (./transformer.js).

import { chart, depthColors, percentileBands, readoutLine, stackDrawer, zeroNote } from "../charts.js";
import { VIEW_HELP, VIEW_LABELS, VIEWS, emptyNote, joinParts, percentileStep, pointLabel, xValues } from "../common.js";
import { h } from "../dom.js";
import { fmt, pct } from "../format.js";
import { CHARTS, METRIC_EPOCH_BAND_FIELDS } from "../schema.js";
import { theme } from "../theme.js";
import { renderFindings } from "./findings.js";
import { ILR_TEXT, renderIlrRow } from "./ilr.js";
import { modelActivity, overviewEpochMap } from "./shared.js";
import { renderTransformer } from "./transformer.js";

export async function renderOverview(ctx) {
  const { api, state, root } = ctx;
  const ov = await api.overview(state.run);
  if (!ctx.alive()) return;
  const epochMap = overviewEpochMap(ov);
  const xMode = state.x;
  const xLabel = xMode === "epoch" ? "epoch" : "step";

  // Findings first: they say where to look.
  const findingsBox = h("section.findings", { id: "findings" });
  root.append(findingsBox);
  renderFindings(findingsBox, ov, ctx);

  // Loss and metrics.
  const metricNames = Object.keys(ov.metrics || {}).sort(metricOrder);
  const metricsSec = h("section.metrics", { id: "sec-metrics" }, h("h2", "Loss and metrics"));
  root.append(metricsSec);
  if (!metricNames.length) {
    metricsSec.append(emptyNote("No loss or metric values were logged in this run."));
  } else {
    // All cells first: chart widths are measured from the laid-out grid.
    const row = h("div.row.metrics-row");
    metricsSec.append(row);
    const cells = metricNames.map(() => h("div.cell"));
    row.append(...cells);
    metricNames.forEach((name, i) => metricChart(cells[i], name, ov.metrics[name],
      { xMode, xLabel, epochMap, log: state.y === "log" && /loss/i.test(name) }));
  }

  // The transformer probes, under the loss they explain; hidden when the run has none
  // (drawn when ./probes answers: the first screen does not wait for it).
  const tx = CHARTS["overview.transformer"];
  const txSec = h("section.transformer", { id: "sec-transformer", hidden: true },
    h("h2", tx.title, h("span.h-help", ` — ${tx.help}`)));
  root.append(txSec);
  renderTransformer(txSec, ctx, { xMode, xLabel, epochMap }).catch((e) => {
    console.warn("tb-introspect: transformer section:", e);
    txSec.dataset.state = "error";
  });

  // One row of three charts per view.
  for (const view of VIEWS) {
    const sec = h("section.view-row", { id: `sec-${view}`, dataset: { view } },
      h("h2", VIEW_LABELS[view], h("span.h-help", ` — ${VIEW_HELP[view]}`)));
    root.append(sec);
    const v = ov.views && ov.views[view];
    if (!v || !v.tensors || !v.tensors.length || !v.steps.length) {
      sec.append(emptyNote(`No ${VIEW_LABELS[view].toLowerCase()} statistics were logged in this run.`,
        "Turn this view on in the writer (see the README) to see it here."));
      continue;
    }
    if (v.first_nonfinite) {
      const t = v.tensors.find((x) => x.tag === v.first_nonfinite.tag);
      sec.append(h("p.nonfinite-note",
        `Non-finite values (NaN/Inf) first at step ${v.first_nonfinite.step} in `,
        h("span.name", t ? t.name : v.first_nonfinite.tag), "."));
    }
    const row = h("div.row");
    sec.append(row);
    const x = xValues(xMode, v.steps, v.epochs, epochMap);
    const cells = [h("div.cell"), h("div.cell"), h("div.cell")];
    row.append(...cells);
    const bandsHandle = rmsBandsChart(cells[0], view, v, x, xLabel, state.y === "log");
    const stackHandle = stackChart(cells[1], view, v, x, xLabel, ctx);
    // Exact zeros have no place on a log axis or in a log-RMS stack: say so where they would be.
    zeroNote(bandsHandle?.el, zeroMedianPoints(v), v.steps.length, "the median tensor's RMS is"
      + " exactly 0 (no signal reached half of them or more); the Layers view lists each tensor");
    zeroNote(stackHandle?.el, (v.stack || []).length
      ? v.steps.filter((_, i) => v.stack.every((row) => !(row[i] > 0))).length : 0,
    v.steps.length, "no layer has a non-zero RMS: nothing to stack");
    activityChart(cells[2], view, v, x, xLabel);
  }

  // Right under the weights' row: it reads the weights' movement against their gradients.
  const ilrSec = h("section.ilr-row", { id: "sec-ilr" },
    h("h2", ILR_TEXT.title, h("span.h-help", ` — ${ILR_TEXT.help}`)));
  root.querySelector("#sec-variable").after(ilrSec);
  const gradients = !!(ov.views && ov.views.gradient && ov.views.gradient.steps?.length);
  renderIlrRow(ilrSec, ov.views && ov.views.variable, ctx, { xMode, xLabel, epochMap, gradients });
}

function metricOrder(a, b) {
  const la = /loss/i.test(a) ? 0 : 1;
  const lb = /loss/i.test(b) ? 0 : 1;
  return la - lb || a.localeCompare(b);
}

/** Per-step line plus the per-epoch (or per-window) band (min–max, 25–75 %, median) of one metric. */
export function metricChart(cell, name, m, { xMode, xLabel, epochMap, log }) {
  const t = theme();
  const parts = [{ x: xValues(xMode, m.steps, m.epochs, epochMap), y: m.values }];
  const b = m.epoch_band;
  const per = b && b.per === "window" ? "window" : "epoch";
  if (b && b.steps && b.steps.length) {
    const bx = xValues(xMode, b.steps, b.epochs, epochMap);
    // min, p25, p50, p75, max: the five series below, in this order.
    for (const k of METRIC_EPOCH_BAND_FIELDS) parts.push({ x: bx, y: b[k] });
  }
  const { x, ys } = joinParts(parts);
  const series = [{ label: name, values: ys[0], color: t.alpha(t.metric, 0.55), width: 1 }];
  const bands = [];
  if (ys.length > 1) {
    const c = t.accent;
    series.push(
      { label: `${per} min`, values: ys[1], color: "transparent", width: 0, spanGaps: true },
      { label: `${per} 25%`, values: ys[2], color: "transparent", width: 0, spanGaps: true },
      { label: `${per} median`, values: ys[3], color: c, width: 2, spanGaps: true, points: true },
      { label: `${per} 75%`, values: ys[4], color: "transparent", width: 0, spanGaps: true },
      { label: `${per} max`, values: ys[5], color: "transparent", width: 0, spanGaps: true },
    );
    bands.push({ upper: 5, lower: 1, fill: t.alpha(c, 0.13) }, { upper: 4, lower: 2, fill: t.alpha(c, 0.3) });
  }
  const stepAt = indexLookup(parts[0].x, m.steps, m.epochs);
  const bandAt = b && b.steps ? indexLookup(parts[1]?.x || [], b.steps, b.epochs) : () => -1;
  return chart(cell, {
    title: name,
    subtitle: b ? `per step, and per-${per} band (${b.source === "logged" ? "logged" : "computed from steps"})` : "per step",
    name: `metric-${name}`,
    x,
    xLabel,
    series,
    bands,
    y: { log },
    legend: [[name, t.metric], ...(ys.length > 1 ? [[`${per} median`, t.accent], ["25–75%", t.alpha(t.accent, 0.4)], ["min–max", t.alpha(t.accent, 0.18)]] : [])],
    readout: (idx) => {
      if (idx == null) return "";
      const xv = x[idx];
      const i = stepAt(xv);
      const j = bandAt(xv);
      const pairs = [];
      let head = "";
      if (i >= 0) {
        head = pointLabel(m.steps[i], m.epochs[i]);
        pairs.push([name, m.values[i]]);
      }
      if (j >= 0) {
        if (!head) head = `epoch ${b.epochs[j]}`;
        pairs.push([per === "window" ? `window to step ${b.steps[j]} median` : `epoch ${b.epochs[j]} median`, b.p50[j]], ["25–75%", `${fmt(b.p25[j])} – ${fmt(b.p75[j])}`],
          ["min–max", `${fmt(b.min[j])} – ${fmt(b.max[j])}`]);
      }
      return readoutLine(head, pairs, i >= 0 && m.values[i] == null ? "non-finite" : null);
    },
  });
}

function indexLookup(xs) {
  const map = new Map();
  xs.forEach((v, i) => map.set(v, i));
  return (v) => (map.has(v) ? map.get(v) : -1);
}

function rmsBandsChart(cell, view, v, x, xLabel, log) {
  const t = theme();
  const color = t.views[view];
  const q = v.rms_quantiles;
  const { series, bands } = percentileBands(q, v.rms_bands, color, (p) => `${p}%`);
  const mid = q.indexOf(50);
  return chart(cell, {
    title: "Per-layer RMS: distribution over layers",
    subtitle: `percentiles over ${v.tensors.length} tensors: median line, ${bandsText(q)} to min–max`,
    name: `${view}-rms-bands`,
    x,
    xLabel,
    series,
    bands,
    y: { log },
    legend: [["median", color], ["percentile bands", t.alpha(color, 0.45)]],
    readout: (idx) => {
      if (idx == null) return "";
      const at = (p) => {
        const i = q.indexOf(p);
        return i >= 0 ? v.rms_bands[i][idx] : null;
      };
      const nonfinite = v.nonfinite ? v.nonfinite[idx] : 0;
      return readoutLine(pointLabel(v.steps[idx], v.epochs[idx]), [
        ["median", mid >= 0 ? v.rms_bands[mid][idx] : null],
        ["25–75%", `${fmt(at(25))} – ${fmt(at(75))}`],
        ["min–max", `${fmt(at(q[0]))} – ${fmt(at(q[q.length - 1]))}`],
      ], nonfinite ? `non-finite values: ${nonfinite}` : null);
    },
  });
}

/** Points whose median band (over tensors) is exactly 0. */
function zeroMedianPoints(v) {
  const mid = v.rms_quantiles.indexOf(50);
  return mid < 0 ? 0 : v.rms_bands[mid].filter((r) => r === 0).length;
}

/** "12.5% steps" for the server's evenly spaced percentile points (overview.RMS_QUANTILES). */
function bandsText(qs) {
  const step = percentileStep(qs);
  return step ? `${step}% steps` : "percentile bands";
}

/** Legend of the stack: every layer when they fit, else the two ends of the ramp. */
const STACK_LEGEND_MAX = 8;

function stackChart(cell, view, v, x, xLabel, ctx) {
  const t = theme();
  const bands = v.stack_layers || [];
  const colors = depthColors(bands.length);
  // A focused tensor (e.g. a bias) highlights its layer's band.
  const focused = v.tensors.find((tt) => tt.tag === ctx.state.focus);
  const focusIdx = focused ? bands.findIndex((b) => b.layer === focused.layer) : -1;
  const drawer = stackDrawer(x, v.stack, {
    colors: { bands: colors, highlight: t.stackHighlight, separator: t.bg },
    highlight: focusIdx,
  });
  const hovered = (u, idx) => {
    if (idx == null || u.cursor.top == null || u.cursor.top < 0) return -1;
    return drawer.layerAt(idx, u.posToVal(u.cursor.top, "y"));
  };
  const n = bands.length;
  const legend = n <= STACK_LEGEND_MAX
    ? bands.map((b, i) => [b.layer, colors[i]])
    : [[`${bands[0].layer} (bottom)`, colors[0]], [`${bands[n - 1].layer} (top)`, colors[n - 1]]];
  let lastHover = -1;
  return chart(cell, {
    title: "Layer scale (stacked log RMS)",
    subtitle: `one band per layer (${n}), first layer at the bottom; thick = large scale,`
      + " jagged = oscillation; click a band to open its layer",
    name: `${view}-stack`,
    x,
    xLabel,
    series: [{ label: "", values: x.map(() => null) }],
    y: { range: [0, 1], format: () => "", size: 8 },
    draw: drawer.draw,
    legend,
    onHover: (u, idx) => {
      const i = hovered(u, idx);
      if (i !== lastHover) {
        lastHover = i;
        drawer.state.hover = i;
        u.redraw(false, false);
        const ro = cell.querySelector(".readout");
        if (ro) {
          ro.textContent = "";
          ro.append(stackReadout(v, i, idx));
        }
      }
    },
    onClick: (u, idx) => {
      const i = hovered(u, idx);
      if (i >= 0) ctx.openLayer(view, bands[i].tag);
    },
    readout: (idx) => stackReadout(v, lastHover, idx),
  });
}

function stackReadout(v, i, idx) {
  if (idx == null) return "";
  if (i < 0) return readoutLine(pointLabel(v.steps[idx], v.epochs[idx]), [["", "hover a band to name its layer"]]);
  const band = v.stack_layers[i];
  const tt = v.tensors[band.tensor];
  const l = v.log10_rms[band.tensor][idx];
  const line = readoutLine(pointLabel(v.steps[idx], v.epochs[idx]), [
    ["RMS", l == null ? null : 10 ** l],
    ["share", pct(v.stack[i][idx])],
  ]);
  line.prepend(h("span.layer-name", tt.layer && tt.layer !== tt.name ? `${tt.layer} · ${tt.name}` : tt.name), " ");
  return line;
}

function activityChart(cell, view, v, x, xLabel) {
  const { series, bands, legend, readout } = modelActivity(v);
  return chart(cell, {
    title: "Activation rate and worst dead rate",
    subtitle: "mean over layers with min–max band; the model is only as good as its weakest layer",
    name: `${view}-activity`,
    x,
    xLabel,
    series,
    bands,
    y: { range: [0, 1], format: (p) => pct(p, 0) },
    legend,
    readout,
  });
}
