// Compare: two or more runs overlaid on the same axes (e.g. the same model at
// two learning rates): metrics, model-level scale and dead rate per view, and
// the per-tensor RMS of the tensors that match the filter.

import { afterPaint, chart, readoutLine } from "../charts.js";
import { VIEW_LABELS, VIEWS, compileFilter, emptyNote, joinParts, xValues } from "../common.js";
import { h } from "../dom.js";
import { pct } from "../format.js";
import { theme } from "../theme.js";
import { overviewEpochMap } from "./shared.js";

const MAX_TENSORS = 24;

export function selectedRuns(state, runNames) {
  const picked = state.cmp.filter((r) => runNames.includes(r));
  if (picked.length) return picked;
  // Default: the current run and the next ones, up to four.
  const start = Math.max(0, runNames.indexOf(state.run));
  const order = [...runNames.slice(start), ...runNames.slice(0, start)];
  return order.slice(0, Math.min(4, order.length));
}

export async function renderCompare(ctx) {
  const { api, state, root } = ctx;
  const t = theme();
  const runNames = (await api.runs()).runs.map((r) => r.run);
  if (!ctx.alive()) return;
  const selected = selectedRuns(state, runNames);
  const color = (run) => t.runs[runNames.indexOf(run) % t.runs.length];

  const picker = h("fieldset.run-picker", h("legend", "Runs to compare"),
    runNames.map((run) => h("label.run-choice",
      h("input", {
        type: "checkbox",
        checked: selected.includes(run),
        value: run,
        on: {
          change: (e) => {
            const next = new Set(selected);
            if (e.target.checked) next.add(run);
            else next.delete(run);
            ctx.setState({ cmp: runNames.filter((r) => next.has(r)) });
          },
        },
      }),
      h("i.sw", { style: { background: color(run) } }),
      h("span.name", run))));
  root.append(picker);
  if (selected.length < 2) {
    root.append(emptyNote(runNames.length < 2
      ? "Only one run holds Introspect data: there is nothing to compare with yet."
      : "Pick two or more runs above to compare them."));
    if (!selected.length) return;
  }

  const ovs = await Promise.all(selected.map((r) => api.overview(r)));
  if (!ctx.alive()) return;
  const maps = ovs.map(overviewEpochMap);
  const xLabel = state.x;

  const overlay = (cell, spec, parts) => {
    const { x, ys } = joinParts(parts.map((p) => ({ x: p.x, y: p.y })));
    const lookups = parts.map((p) => new Map(p.x.map((xv, i) => [xv, i])));
    return chart(cell, {
      ...spec,
      x,
      xLabel,
      legend: parts.map((p) => [p.run, color(p.run)]),
      series: parts.map((p, i) => ({ label: p.run, values: ys[i], color: color(p.run), width: 1.5, spanGaps: true })),
      readout: (idx) => {
        if (idx == null) return "";
        const pairs = parts.map((p, i) => {
          const j = lookups[i].get(x[idx]);
          const val = j == null ? null : p.y[j];
          const label = j == null ? p.run : `${p.run} @ ${p.steps[j]}`;
          return [label, spec.percent ? pct(val) : val, color(p.run)];
        });
        return readoutLine(`${xLabel} ${+x[idx].toFixed(3)}`, pairs);
      },
    });
  };

  // Metrics.
  const metricNames = [...new Set(ovs.flatMap((o) => Object.keys(o.metrics || {})))].sort((a, b) =>
    (/loss/i.test(a) ? 0 : 1) - (/loss/i.test(b) ? 0 : 1) || a.localeCompare(b));
  const ms = h("section", h("h2", "Loss and metrics"));
  root.append(ms);
  if (!metricNames.length) ms.append(emptyNote("None of these runs logged a loss or metric."));
  const mrow = h("div.row");
  ms.append(mrow);
  const metricCells = [];
  for (const name of metricNames) {
    const parts = [];
    ovs.forEach((o, i) => {
      const m = o.metrics && o.metrics[name];
      if (m && m.steps.length) parts.push({ run: selected[i], steps: m.steps, x: xValues(state.x, m.steps, m.epochs, maps[i]), y: m.values });
    });
    if (!parts.length) continue;
    const cell = h("div.cell");
    mrow.append(cell);
    metricCells.push([cell, name, parts]);
  }
  // Charts after all cells exist: widths come from the laid-out grid.
  for (const [cell, name, parts] of metricCells) {
    overlay(cell, { title: name, name: `compare-${name}`, y: { log: state.y === "log" && /loss/i.test(name) } }, parts);
  }

  // Model-level scale and dead rate, per view.
  for (const view of VIEWS) {
    const withView = ovs.map((o, i) => [o.views && o.views[view], i]).filter(([v]) => v && v.steps.length);
    if (!withView.length) continue;
    const sec = h("section", h("h2", VIEW_LABELS[view]));
    const row = h("div.row");
    sec.append(row);
    root.append(sec);
    const rmsParts = withView.map(([v, i]) => {
      const mid = v.rms_quantiles.indexOf(50);
      return { run: selected[i], steps: v.steps, x: xValues(state.x, v.steps, v.epochs, maps[i]), y: mid >= 0 ? v.rms_bands[mid] : [] };
    });
    const deadParts = withView.map(([v, i]) => ({
      run: selected[i], steps: v.steps, x: xValues(state.x, v.steps, v.epochs, maps[i]), y: v.activity?.dead_rate?.max || [],
    }));
    const c1 = h("div.cell");
    const c2 = h("div.cell");
    row.append(c1, c2);
    overlay(c1, { title: "Median per-layer RMS", name: `compare-${view}-rms`, y: { log: state.y === "log" } }, rmsParts);
    overlay(c2, { title: "Worst dead rate", name: `compare-${view}-dead`, percent: true, y: { range: [0, 1], format: (p) => pct(p, 0) } }, deadParts);
  }

  // Per-tensor RMS of the chosen view, tensors matching the filter.
  const infos = await Promise.all(selected.map((r) => api.run(r)));
  if (!ctx.alive()) return;
  const view = state.view;
  const filter = compileFilter(state.filter);
  const seen = new Map();
  infos.forEach((info) => (info.views[view] || []).forEach((tt) => seen.has(tt.tag) || seen.set(tt.tag, tt)));
  const tensors = [...seen.values()].filter(filter.test);
  const ts = h("section", h("h2", `${VIEW_LABELS[view]}: RMS per tensor`,
    h("span.h-help", tensors.length > MAX_TENSORS ? ` — first ${MAX_TENSORS} of ${tensors.length}; narrow them with the filter` : "")));
  root.append(ts);
  if (!tensors.length) {
    ts.append(emptyNote(seen.size ? `No tensor name matches the filter “${state.filter}”.` : `None of these runs logged ${VIEW_LABELS[view].toLowerCase()} statistics.`));
  } else {
    const grid = h("div.grid");
    ts.append(grid);
    const shown = tensors.slice(0, MAX_TENSORS);
    const perRun = await Promise.all(selected.map((r, i) => {
      const have = new Set((infos[i].views[view] || []).map((tt) => tt.tag));
      const tags = shown.map((tt) => tt.tag).filter((tag) => have.has(tag));
      return tags.length ? api.series(r, tags, ["rms"]) : {};
    }));
    if (!ctx.alive()) return;
    for (const tt of shown) {
      const parts = [];
      perRun.forEach((series, i) => {
        const s = series[tt.tag];
        if (s) parts.push({ run: selected[i], steps: s.steps, x: xValues(state.x, s.steps, s.epochs, maps[i]), y: s.values.rms });
      });
      const tools = h("div.panel-tools");
      const cell = h("div.panel", { dataset: { tag: tt.tag } }, h("div.panel-head", h("div.panel-name", { title: tt.tag }, tt.name), tools));
      grid.append(cell);
      overlay(cell, { name: `compare-${tt.name}`, height: 140, toolsIn: tools, y: { log: state.y === "log" } }, parts);
    }
  }
  await afterPaint();
}
