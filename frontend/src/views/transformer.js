// The Overview's Transformer section: the probes of a run (./probes, format 4) per layer
// over steps, each chart with the reference threshold the findings use drawn dashed.
// Shown only when the run has probes; the findings' "chart" jumps name these charts
// (diagnose/transformer.py CHARTS).

import { chart, depthColors, readoutLine } from "../charts.js";
import { emptyNote, pointLabel, xValues } from "../common.js";
import { h } from "../dom.js";
import { fmt } from "../format.js";
import { CHARTS, PROBE_REFERENCES } from "../schema.js";
import { theme } from "../theme.js";

/** Legend of a per-layer chart: every row when they fit, else the two ends of the ramp. */
const LEGEND_MAX = 8;

/**
 * Draws the section into `sec` (hidden until the run turns out to have probes).
 * `opts`: {xMode, xLabel, epochMap}. Resolves when drawn (or when there is nothing).
 */
export async function renderTransformer(sec, ctx, opts) {
  sec.dataset.state = "loading";
  let doc;
  try {
    doc = await ctx.api.probes(ctx.state.run);
  } catch (e) {
    if (!ctx.alive()) return;
    sec.hidden = false;
    sec.append(h("p.error", `Could not read the probes: ${e.message}`));
    sec.dataset.state = "ready";
    return;
  }
  if (!ctx.alive()) return;
  if (!doc.rows || !doc.rows.length) {
    sec.dataset.state = "none";
    return;
  }
  sec.hidden = false;
  if (!doc.rows.some((r) => r.kind === "attention")) {
    // No attention layer: the section holds a classifier's head and outliers.
    const text = CHARTS["overview.probes"];
    const title = sec.querySelector("h2");
    if (title) title.replaceChildren(text.title, h("span.h-help", ` — ${text.help}`));
  }
  const refs = doc.references || PROBE_REFERENCES;
  const x = xValues(opts.xMode, doc.steps, doc.epochs, opts.epochMap);
  const at = (field, kind) => doc.rows
    .map((r, i) => ({ row: r, values: doc.values[field][i] }))
    .filter((r) => (!kind || r.row.kind === kind) && r.values.some((v) => v != null));
  const specs = [
    { key: "transformer.attn", name: "probes-attn", rows: at("attn_logit_max", "attention"), ref: refs.attn_logit_max, log: true,
      none: "No attention layer was found in this model; the other probes apply to any model." },
    { key: "transformer.head", name: "probes-head", head: true },
    { key: "transformer.ratio", name: "probes-ratio", rows: at("massive_ratio"), ref: refs.massive_ratio, log: true },
    { key: "transformer.kurtosis", name: "probes-kurtosis", rows: at("kurtosis"), ref: refs.kurtosis, log: true },
  ];
  const row = h("div.row.transformer-row");
  sec.append(row);
  const cells = specs.map(() => h("div.cell"));
  row.append(...cells);
  specs.forEach((s, i) => {
    if (s.head) headChart(cells[i], doc, x, opts.xLabel);
    else rowsChart(cells[i], s, doc, x, opts.xLabel);
  });
  sec.dataset.state = "ready";
}

/** One line per row (layer colours by depth order) and the dashed reference. */
function rowsChart(cell, spec, doc, x, xLabel) {
  const t = theme();
  const text = CHARTS[spec.key];
  if (!spec.rows.length) {
    cell.append(h("div.chart-title", text.title), emptyNote(spec.none || "No layer of this run has this probe."));
    return null;
  }
  const colors = depthColors(spec.rows.length);
  const series = spec.rows.map((r, i) => ({ label: r.row.name, values: r.values, color: colors[i], width: 1.5, points: x.length < 40 }));
  series.push({ label: `reference ${spec.ref}`, values: x.map(() => spec.ref), color: t.muted, width: 1, dash: [6, 4] });
  const n = spec.rows.length;
  const legend = n <= LEGEND_MAX
    ? spec.rows.map((r, i) => [r.row.name, colors[i]])
    : [[`${spec.rows[0].row.name} (first)`, colors[0]], [`${spec.rows[n - 1].row.name} (last)`, colors[n - 1]]];
  legend.push([`${spec.ref} (reference)`, t.muted]);
  return chart(cell, {
    title: text.title,
    subtitle: text.help,
    name: spec.name,
    x,
    xLabel,
    series,
    y: { log: spec.log },
    legend,
    readout: (idx) => {
      if (idx == null) return "";
      // The largest row at this point: the one a reader compares with the reference.
      let best = -1;
      for (let i = 0; i < n; i++) {
        const v = spec.rows[i].values[idx];
        if (v != null && (best < 0 || v > spec.rows[best].values[idx])) best = i;
      }
      return readoutLine(pointLabel(doc.steps[idx], doc.epochs[idx]), [
        ...(best >= 0 ? [["largest", `${spec.rows[best].row.name} ${fmt(spec.rows[best].values[idx], 4)}`, colors[best]]] : []),
        ["reference", spec.ref],
      ]);
    },
  });
}

/** The output head's largest logit and log Z, with 0 (where z-loss keeps log Z) dashed. */
function headChart(cell, doc, x, xLabel) {
  const t = theme();
  const text = CHARTS["transformer.head"];
  const heads = doc.rows.map((r, i) => ({ row: r, i })).filter((r) => r.row.kind === "head");
  if (!heads.length) {
    cell.append(h("div.chart-title", text.title), emptyNote("No output head was found in this model."));
    return null;
  }
  const colors = [t.accent, t.metric, t.views.gradient, t.views.output];
  const series = [];
  const legend = [];
  heads.forEach((hd, k) => {
    const c = colors[k % colors.length];
    const suffix = heads.length > 1 ? ` (${hd.row.name})` : "";
    series.push({ label: `logit max${suffix}`, values: doc.values.logit_max[hd.i], color: c, width: 1.75, points: x.length < 40 });
    series.push({ label: `log Z${suffix}`, values: doc.values.logit_lse[hd.i], color: c, width: 1.25, dash: [2, 2] });
    legend.push([`logit max${suffix}`, c], [`log Z (dotted)${suffix}`, t.alpha(c, 0.6)]);
  });
  series.push({ label: "0", values: x.map(() => 0), color: t.muted, width: 1, dash: [6, 4] });
  legend.push(["0 (z-loss target)", t.muted]);
  return chart(cell, {
    title: text.title,
    subtitle: text.help,
    name: "probes-head",
    x,
    xLabel,
    series,
    legend,
    readout: (idx) => idx == null ? "" : readoutLine(pointLabel(doc.steps[idx], doc.epochs[idx]),
      heads.flatMap((hd, k) => [
        [`max${heads.length > 1 ? ` ${hd.row.name}` : ""}`, doc.values.logit_max[hd.i][idx], colors[k % colors.length]],
        ["log Z", doc.values.logit_lse[hd.i][idx]],
      ])),
  });
}

