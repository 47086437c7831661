// Pieces shared by the Overview and the Activity view.

import { readoutLine } from "../charts.js";
import { EpochMap, pointLabel } from "../common.js";
import { pct } from "../format.js";
import { theme } from "../theme.js";

/** Step -> epoch progress map from every (step, epoch) pair in an overview. */
export function overviewEpochMap(ov) {
  const map = new EpochMap();
  for (const m of Object.values(ov.metrics || {})) {
    map.add(m.steps, m.epochs);
    if (m.epoch_band) map.add(m.epoch_band.steps, m.epoch_band.epochs);
  }
  for (const v of Object.values(ov.views || {})) map.add(v.steps, v.epochs);
  return map;
}

/** Series, band and readout of the model-level activity chart of one view. */
export function modelActivity(v) {
  const t = theme();
  const a = v.activity || {};
  const act = a.activation_rate || {};
  const dead = a.dead_rate || {};
  const sp = a.spatial_dead_rate || {};
  const hasSpatial = (sp.max || []).some((z) => z != null);
  const series = [
    { label: "activation min", values: act.min || [], color: "transparent", width: 0 },
    { label: "activation mean", values: act.mean || [], color: t.active, width: 1.5 },
    { label: "activation max", values: act.max || [], color: "transparent", width: 0 },
    { label: "worst dead rate", values: dead.max || [], color: t.dead, width: 1.5 },
  ];
  if (hasSpatial) series.push({ label: "worst spatial dead", values: sp.max, color: t.spatial, width: 1.25, dash: [4, 3] });
  const name = (k) => (k == null || !v.tensors[k] ? "" : v.tensors[k].name);
  return {
    t,
    series,
    bands: [{ upper: 2, lower: 0, fill: t.alpha(t.active, 0.22) }],
    legend: [["activation mean", t.active], ["min–max", t.alpha(t.active, 0.3)], ["worst dead", t.dead],
      ...(hasSpatial ? [["worst spatial dead", t.spatial]] : [])],
    readout: (idx) => idx == null ? "" : readoutLine(pointLabel(v.steps[idx], v.epochs[idx]), [
      ["active", pct(act.mean?.[idx])],
      ["min–max", `${pct(act.min?.[idx])} – ${pct(act.max?.[idx])}`],
      ["worst dead", dead.max?.[idx] == null ? "—" : `${pct(dead.max[idx])} (${name(dead.worst?.[idx])})`],
      ...(hasSpatial ? [["spatial dead", sp.max?.[idx] == null ? "—" : `${pct(sp.max[idx])} (${name(sp.worst?.[idx])})`]] : []),
    ]),
  };
}
