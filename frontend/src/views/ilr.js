// The Overview's implicit-learning-rate row: per layer (its largest variable,
// as the stack plot picks it) the median over its elements of the implicit
// learning rate between logged points (its formula and help: the schema's
// CHARTS["overview.ilr"]), from the `ilr` entry of the variable view in `./overview`. Left: the band over layers of those medians; right: one
// line per layer coloured by depth, so that a layer departing from the others
// stands out (hover names it, a click opens it in the Layers view's ILR mode).

import { chart, depthColors, percentileBands, readoutLine } from "../charts.js";
import { emptyNote, pointLabel, xValues } from "../common.js";
import { h } from "../dom.js";
import { fmt } from "../format.js";
import { CHARTS } from "../schema.js";
import { theme } from "../theme.js";

/** Legend of the per-layer lines: every layer when they fit, else the two ends of the ramp. */
const LEGEND_MAX = 8;
/** How near (CSS px) the cursor must be to a line to pick its layer. */
const HOVER_PX = 12;

/** The section's title and help text. */
export const ILR_TEXT = CHARTS["overview.ilr"];

/**
 * Draws the row into `sec` (already in the page: charts measure their cells).
 * `v`: the variable view's overview entry (undefined when not logged); `gradients`: whether the
 * gradient view was logged.
 */
export function renderIlrRow(sec, v, ctx, { xMode, xLabel, epochMap, gradients }) {
  const ilr = v && v.ilr;
  if (!ilr) {
    sec.append(emptyNote(v && gradients
      ? "No implicit learning rate in this run: no layer's weight tensor got a non-zero gradient"
        + " sum between two logged points (see the gradient findings)."
      : "No implicit learning rate in this run: it needs the weight and the gradient views,"
        + " written in format version 2 or later."));
    return;
  }
  const row = h("div.row");
  sec.append(row);
  // Three cells as in the view rows above, so the columns line up.
  const cells = [h("div.cell"), h("div.cell"), h("div.cell")];
  row.append(...cells);
  const x = xValues(xMode, v.steps, v.epochs, epochMap);
  bandChart(cells[0], v, ilr, x, xLabel);
  layersChart(cells[1], v, ilr, x, xLabel, ctx);
}

/** The layer with the lowest and the highest median at column `idx`. */
function extremes(ilr, idx) {
  let lo = -1;
  let hi = -1;
  ilr.median.forEach((r, k) => {
    const val = r[idx];
    if (val == null) return;
    if (lo < 0 || val < ilr.median[lo][idx]) lo = k;
    if (hi < 0 || val > ilr.median[hi][idx]) hi = k;
  });
  return { lo, hi };
}

function bandChart(cell, v, ilr, x, xLabel) {
  const t = theme();
  const color = t.views.variable;
  const q = ilr.band_quantiles;
  const { series, bands } = percentileBands(q, ilr.band, color, (p) => `${p}%`);
  const at = (p, idx) => {
    const i = q.indexOf(p);
    return i >= 0 ? ilr.band[i][idx] : null;
  };
  const layer = (k) => (k >= 0 ? ilr.layers[k].layer : "—");
  return chart(cell, {
    title: `${ILR_TEXT.title}: distribution over layers`,
    subtitle: `each layer's median over its weights (${ilr.layers.length} layers): median line, 25–75% and min–max bands`,
    name: "variable-ilr-bands",
    x,
    xLabel,
    series,
    bands,
    y: { log: true },
    legend: [["median", color], ["25–75%", t.alpha(color, 0.55)], ["min–max", t.alpha(color, 0.3)]],
    readout: (idx) => {
      if (idx == null) return "";
      const { lo, hi } = extremes(ilr, idx);
      return readoutLine(pointLabel(v.steps[idx], v.epochs[idx]), [
        ["median", at(50, idx)],
        ["25–75%", `${fmt(at(25, idx))} – ${fmt(at(75, idx))}`],
        ["lowest", `${layer(lo)} ${fmt(at(q[0], idx))}`],
        ["highest", `${layer(hi)} ${fmt(at(q[q.length - 1], idx))}`],
      ]);
    },
  });
}

function layersChart(cell, v, ilr, x, xLabel, ctx) {
  const t = theme();
  const n = ilr.layers.length;
  const colors = depthColors(n);
  const focused = v.tensors.find((tt) => tt.tag === ctx.state.focus);
  const state = { hover: -1, focus: focused ? ilr.layers.findIndex((l) => l.layer === focused.layer) : -1 };
  const legend = n <= LEGEND_MAX
    ? ilr.layers.map((l, i) => [l.layer, colors[i]])
    : [[`${ilr.layers[0].layer} (input side)`, colors[0]], [`${ilr.layers[n - 1].layer} (output side)`, colors[n - 1]]];
  const mid = ilr.band_quantiles.indexOf(50);
  // The hovered or focused layer, drawn again on top in the highlight colour.
  const draw = (u) => {
    const ctx2 = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx2.save();
    ctx2.beginPath();
    ctx2.rect(left, top, width, height);
    ctx2.clip();
    ctx2.strokeStyle = t.stackHighlight;
    ctx2.lineWidth = 2.5 * (window.devicePixelRatio || 1);
    for (const k of new Set([state.hover, state.focus])) {
      if (k < 0) continue;
      const ys = u.data[k + 1];
      ctx2.beginPath();
      let pen = false;
      for (let j = 0; j < ys.length; j++) {
        if (ys[j] == null) {
          pen = false;
          continue;
        }
        const px = u.valToPos(u.data[0][j], "x", true);
        const py = u.valToPos(ys[j], "y", true);
        if (pen) ctx2.lineTo(px, py);
        else ctx2.moveTo(px, py);
        pen = true;
      }
      ctx2.stroke();
    }
    ctx2.restore();
  };
  const hovered = (u, idx) => {
    if (idx == null || u.cursor.top == null || u.cursor.top < 0) return -1;
    let best = -1;
    let bestD = HOVER_PX;
    for (let k = 0; k < n; k++) {
      const val = u.data[k + 1][idx];
      if (val == null) continue;
      const d = Math.abs(u.valToPos(val, "y") - u.cursor.top);
      if (d < bestD) {
        bestD = d;
        best = k;
      }
    }
    return best;
  };
  const readout = (idx) => {
    if (idx == null) return "";
    const head = pointLabel(v.steps[idx], v.epochs[idx]);
    const overall = mid >= 0 ? ilr.band[mid][idx] : null;
    const k = state.hover;
    if (k < 0) return readoutLine(head, [["median over layers", overall], ["", "hover a line to name its layer"]]);
    const val = ilr.median[k][idx];
    const line = readoutLine(head, [
      ["median ILR", val],
      ["× layers' median", val != null && overall ? val / overall : null],
    ]);
    line.prepend(h("span.layer-name", ilr.layers[k].layer), " ");
    return line;
  };
  let lastHover = -1;
  return chart(cell, {
    title: `${ILR_TEXT.title} per layer`,
    subtitle: "median over each layer's largest variable, coloured by depth (light = input side);"
      + " a layer far from the others stands out; click a line to open its layer",
    name: "variable-ilr-layers",
    x,
    xLabel,
    series: ilr.median.map((r, k) => ({ label: ilr.layers[k].layer, values: r, color: colors[k], width: 1.5 })),
    y: { log: true },
    legend,
    draw,
    onHover: (u, idx) => {
      const k = hovered(u, idx);
      if (k !== lastHover) {
        lastHover = k;
        state.hover = k;
        u.redraw(false, false);
        const ro = cell.querySelector(".readout");
        if (ro && idx != null) {
          ro.textContent = "";
          ro.append(readout(idx));
        }
      }
    },
    onClick: (u, idx) => {
      const k = hovered(u, idx);
      if (k >= 0) ctx.openLayer("variable", ilr.layers[k].tag, "ilr");
    },
    readout,
  });
}
