// Activity: per-tensor activation rate and dead rate (and spatial dead rate
// for convolutional tensors), the final dead % labelled in every panel, under
// a model-level summary (mean activation with min–max band, worst dead rate).

import { afterPaint, chart, readoutLine } from "../charts.js";
import { EpochMap, VIEW_LABELS, compileFilter, emptyNote, pointLabel, sampleBudget, shapeText, xValues } from "../common.js";
import { h } from "../dom.js";
import { pct } from "../format.js";
import { ACTIVITY_FIELDS, SLOT_HELP, SLOT_LABELS, WINDOW_STEP_FIELDS } from "../schema.js";
import { theme } from "../theme.js";
import { LazyDrawer } from "../lazy.js";
import { renderActivityMaps } from "./activitymap.js";
import { modelActivity, overviewEpochMap } from "./shared.js";

// WINDOW_STEP_FIELDS: how many of a window's steps the activity and the other statistics
// came from (layer outputs written since these slots exist; older runs lack them).
// Browsers open at most 6 HTTP/1.1 connections per host (TensorBoard's server
// closes each after one response): split the tensors into at most that many
// requests, so none waits for a free connection.
const PARALLEL = 6;
const chunkSize = (n) => Math.max(10, Math.ceil(n / PARALLEL));

export async function renderActivity(ctx) {
  const { api, state, root } = ctx;
  const view = state.aview;
  const [info, ov] = await Promise.all([api.run(state.run), api.overview(state.run)]);
  if (!ctx.alive()) return;
  const all = info.views[view] || [];
  const filter = compileFilter(state.filter);
  const tensors = all.filter(filter.test);
  const cadence = h("p.hint.cadence");
  root.append(h("div.view-head", h("h2", `Activity of ${VIEW_LABELS[view].toLowerCase()}: ${tensors.length} of ${all.length} tensors`)),
    h("p.hint", activityHint()),
    cadence);
  if (!all.length) {
    root.append(emptyNote(`No ${VIEW_LABELS[view].toLowerCase()} statistics were logged in run “${state.run}”.`,
      "Activity is most telling for layer outputs and gradients; pick another view above."));
    return;
  }
  const epochMap = overviewEpochMap(ov);
  const v = ov.views && ov.views[view];
  if (v) {
    const sum = h("div.summary");
    root.append(sum);
    const { series, bands, legend, readout } = modelActivity(v);
    chart(sum, {
      title: "Model: mean activation rate (min–max band) and worst dead rate",
      name: `${view}-activity-model`,
      x: xValues(state.x, v.steps, v.epochs, epochMap),
      xLabel: state.x,
      series,
      bands,
      height: 160,
      y: { range: [0, 1], format: (p) => pct(p, 0) },
      legend,
      readout,
    });
  }
  // Layer outputs only: the maps count non-zero activations. Drawn while the grid loads.
  const maps = view === "output" ? renderActivityMaps(ctx, root, info) : null;
  if (!tensors.length) {
    root.append(emptyNote(`No tensor name matches the filter “${state.filter}”.`));
    await maps;
    return;
  }
  const grid = h("div.grid.activity");
  root.append(grid);
  const panels = tensors.map((tt) => {
    const plot = h("div.panel-plot");
    const label = h("span.final");
    const tools = h("div.panel-tools", label);
    const counted = h("span.counted");
    const el = h("div.panel", { dataset: { tag: tt.tag } },
      h("div.panel-head", h("div.panel-name", { title: tt.tag }, tt.name), tools),
      h("div.panel-meta", h("span.shape", `shape ${shapeText(tt.shape)}`), counted),
      plot);
    return { el, plot, label, tools, counted, tensor: tt, chart: null };
  });
  grid.append(...panels.map((p) => p.el));
  const focus = panels.find((p) => p.tensor.tag === state.focus);
  if (focus) {
    focus.el.classList.add("focused");
    focus.el.scrollIntoView({ block: "center" });
  }
  const width = Math.max(180, panels[0].plot.clientWidth);
  // About one point per pixel column (see layers.js).
  const budget = Math.max(200, Math.ceil(width));
  const lazy = new LazyDrawer((p) => drawPanel(ctx, p, p.series, width, epochMap), () => ctx.markComplete());
  ctx.onCleanup(() => lazy.stop());
  for (const p of panels) lazy.watch(p);
  const jobs = [];
  const size = chunkSize(panels.length);
  for (let i = 0; i < panels.length; i += size) {
    const part = panels.slice(i, i + size);
    const downsample = part.some((p) => sampleBudget(p.tensor, budget)) ? budget : 0;
    const steps = WINDOW_STEP_FIELDS.filter((f) => part.some((p) => (p.tensor.fields || []).includes(f)));
    jobs.push(api.series(state.run, part.map((p) => p.tensor.tag), [...ACTIVITY_FIELDS, ...steps], { downsample, chunk: size }).then((series) => {
      if (!ctx.alive()) return;
      for (const p of part) {
        p.series = series[p.tensor.tag];
        if (p.series) lazy.ready(p);
      }
    }));
  }
  await Promise.all([...jobs, maps]);
  if (!ctx.alive()) return;
  cadence.textContent = cadenceText(panels.map((p) => p.series).find((s) => s && s.values.stats_steps), view);
  await lazy.drawNear();
  if (focus && ctx.alive()) focus.el.scrollIntoView({ block: "center" });
  await afterPaint();
}

/** The colour key over the grid: each activity slot's colour and meaning, then "exact"/"sampled". */
function activityHint() {
  const colours = { activation_rate: "Blue", dead_rate: "Red", spatial_dead_rate: "Orange" };
  const keys = ACTIVITY_FIELDS.map((f) => `${colours[f]}: ${SLOT_LABELS[f]} (${SLOT_HELP[f]}). `);
  return `${keys.join("")}${SLOT_HELP.activity_steps}.`;
}

function lastFinite(arr) {
  for (let i = (arr || []).length - 1; i >= 0; i--) if (arr[i] != null) return arr[i];
  return null;
}

// "Output statistics from 1 step in N" at the last logged point ("" when not recorded).
function cadenceText(s, view) {
  const stats = s ? lastFinite(s.values.stats_steps) : null;
  const steps = s ? lastFinite(s.values.steps) : null;
  if (!(stats > 0) || !(steps > 0)) return "";
  return `${VIEW_LABELS[view]} statistics at the last point: from ${stats} of its ${steps} steps (1 step in ${Math.round(steps / stats)}).`;
}

// "exact" or "sampled · 1 step in N" from the last point's step counts (null when unknown).
export function countedText(values) {
  const activity = lastFinite(values.activity_steps);
  const steps = lastFinite(values.steps);
  const stats = lastFinite(values.stats_steps);
  if (activity == null || steps == null || !(steps > 0)) return null;
  const exact = activity >= steps;
  const every = stats > 0 ? Math.round(steps / stats) : null;
  const cadence = every ? `statistics from 1 step in ${every}` : "";
  return {
    exact,
    text: exact ? "activity exact" : `activity sampled${every ? ` · 1 step in ${every}` : ""}`,
    title: exact ? `activity counted on every step; ${cadence}` : `activity counted on the statistics steps only (${stats} of ${steps} steps)`,
  };
}

function drawPanel(ctx, p, s, width, epochMap) {
  const t = theme();
  const act = s.values.activation_rate || [];
  const dead = s.values.dead_rate || [];
  const spatial = s.values.spatial_dead_rate || [];
  const hasSpatial = spatial.some((z) => z != null);
  const finalDead = lastFinite(dead);
  p.label.textContent = finalDead == null ? "dead —" : `dead ${pct(finalDead)}`;
  const counted = countedText(s.values);
  if (counted) {
    p.counted.textContent = counted.text;
    p.counted.title = counted.title;
    p.counted.classList.add(counted.exact ? "exact" : "sampled");
  }
  if (finalDead != null && finalDead > 0.2) p.label.classList.add("bad");
  const series = [
    { label: SLOT_LABELS.activation_rate, values: act, color: t.active, width: 1.25, fill: t.alpha(t.active, 0.25) },
    { label: SLOT_LABELS.dead_rate, values: dead, color: t.dead, width: 1.25, fill: t.alpha(t.dead, 0.3) },
  ];
  if (hasSpatial) series.push({ label: SLOT_LABELS.spatial_dead_rate, values: spatial, color: t.spatial, width: 1.25, dash: [4, 3] });
  const em = epochMap.empty ? new EpochMap().add(s.steps, s.epochs) : epochMap;
  p.chart = chart(p.plot, {
    name: `activity-${p.tensor.name}`,
    x: xValues(ctx.state.x, s.steps, s.epochs, em),
    xLabel: ctx.state.x,
    width,
    height: 130,
    toolsIn: p.tools,
    series,
    y: { range: [0, 1], format: (v) => pct(v, 0) },
    readout: (idx) => idx == null ? "" : readoutLine(pointLabel(s.steps[idx], s.epochs[idx]), [
      ["active", pct(act[idx]), t.active],
      ["dead", pct(dead[idx]), t.dead],
      ...(hasSpatial ? [["spatial dead", pct(spatial[idx]), t.spatial]] : []),
    ]),
  });
}
