// The findings panel of the Overview: automatic diagnoses from the server's
// rules (docs/findings.md), most severe first; a click jumps to the evidence.

import { VIEW_LABELS } from "../common.js";
import { h } from "../dom.js";
import { fmt } from "../format.js";
import { viewOfTag } from "../slots.js";

const RANK = { critical: 0, error: 0, warning: 1, warn: 1, info: 2 };

/** Accepts the rules' JSON with some tolerance for field names. */
export function normaliseFinding(f) {
  const severity = String(f.severity || "info").toLowerCase();
  const layers = asList(f.layers ?? f.layer);
  const tags = asList(f.tags ?? f.tag);
  const view = f.view || tags.map(viewOfTag).find(Boolean) || null;
  return {
    kind: f.kind || f.rule || "finding",
    severity: RANK[severity] === undefined ? "info" : severity === "error" ? "critical" : severity === "warn" ? "warning" : severity,
    title: f.title || f.summary || f.message || f.kind || "finding",
    step: f.first_step ?? f.step ?? null,
    epoch: f.first_epoch ?? f.epoch ?? null,
    layers,
    tags,
    view,
    metric: f.metric || null,
    evidence: f.evidence ?? null,
    explanation: f.explanation || f.description || "",
    suggestion: f.suggestion || f.what_to_try || f.advice || f.try || "",
    // Where the rules say the evidence is drawn: {tab, view, tag, metric, chart}.
    jump: f.jump && typeof f.jump === "object" ? f.jump : {},
  };
}

function asList(v) {
  if (v == null) return [];
  return Array.isArray(v) ? v.filter((x) => x != null).map(String) : [String(v)];
}

export function sortFindings(findings) {
  return findings
    .map((f, i) => ({ f: normaliseFinding(f), i }))
    .sort((a, b) => RANK[a.f.severity] - RANK[b.f.severity] || (a.f.step ?? Infinity) - (b.f.step ?? Infinity) || a.i - b.i)
    .map((x) => x.f);
}

/**
 * Draws the findings of `ov` into `box`. An overview drawn from view summaries has
 * `findings: null`: the box says they are being read, asks ./findings (every tensor's
 * own statistics), then draws them. `box.dataset.state` is "loading", then "ready".
 */
export function renderFindings(box, ov, ctx) {
  if (ov.findings === null && !ov.findings_error) {
    box.dataset.state = "loading";
    box.append(h("h2", "Findings"), h("p.loading", "Reading every tensor's statistics for the findings…"));
    ctx.api.findings(ctx.state.run).then(
      (doc) => ctx.alive() && (box.replaceChildren(), renderFindings(box, doc, ctx)),
      (e) => ctx.alive() && (box.replaceChildren(), renderFindings(box, { findings: [], findings_error: e.message }, ctx)),
    );
    return;
  }
  box.dataset.state = "ready";
  // Since the iframe's navigation start (benchmarks/frontend_bench.py reads it).
  box.dataset.readyAt = performance.now().toFixed(1);
  const findings = sortFindings(ov.findings || []);
  const counts = { critical: 0, warning: 0, info: 0 };
  for (const f of findings) counts[f.severity]++;
  box.append(h("h2", "Findings",
    h("span.counts", ...["critical", "warning", "info"].filter((s) => counts[s]).map((s) => h(`span.badge.${s}`, `${counts[s]} ${s}`)))));
  if (ov.findings_error) {
    box.append(h("p.error", "The diagnosis rules failed on this run: ", ov.findings_error));
  }
  if (!findings.length) {
    box.append(h("p.ok", ov.findings_error ? "No findings to show." : "No problems detected in this run."));
    return;
  }
  const list = h("ol.finding-list");
  box.append(list);
  for (const f of findings) {
    const where = [];
    if (f.step != null) where.push(`since step ${f.step}`);
    if (f.epoch != null) where.push(`epoch ${f.epoch}`);
    const item = h(`li.finding.${f.severity}`, {
      tabindex: 0,
      title: "Show the evidence",
      dataset: { kind: f.kind, severity: f.severity },
      on: {
        click: (e) => {
          if (e.target.closest("details")) return;
          jump(f, ctx);
        },
        keydown: (e) => e.key === "Enter" && jump(f, ctx),
      },
    },
    h("div.f-head",
      h(`span.badge.${f.severity}`, f.severity),
      h("span.f-title", f.title),
      where.length ? h("span.f-when", where.join(", ")) : null),
    f.layers.length ? h("div.f-layers", "layers: ", f.layers.slice(0, 8).map((l, i) => [i ? ", " : "", h("span.name", l)]),
      f.layers.length > 8 ? ` and ${f.layers.length - 8} more` : "") : null,
    evidenceNode(f.evidence),
    f.explanation || f.suggestion
      ? h("details", h("summary", "why it matters, what to try"),
        f.explanation ? h("p", f.explanation) : null,
        f.suggestion ? h("p.try", h("b", "Try: "), f.suggestion) : null)
      : null);
    list.append(item);
  }
}

function evidenceNode(ev) {
  if (ev == null) return null;
  if (typeof ev === "string") return h("div.f-evidence", ev);
  if (typeof ev !== "object") return h("div.f-evidence", String(ev));
  const parts = [];
  for (const [k, v] of Object.entries(ev)) {
    if (v == null || typeof v === "object") continue;
    parts.push(h("span.pair", h("span.k", k.replace(/_/g, " ")), " ", h("span.v", typeof v === "number" ? fmt(v, 4) : String(v))));
  }
  return parts.length ? h("div.f-evidence", parts) : null;
}

/** Opens, or scrolls to, the chart that shows the evidence of a finding. */
function jump(f, ctx) {
  const j = f.jump;
  const view = j.view || f.view;
  const tag = j.tag || f.tags[0];
  if (j.tab === "layers" || j.tab === "activity" || (!j.tab && tag && view)) {
    if (tag && view) {
      if (j.chart === "activity" || j.tab === "activity") ctx.openActivity(view, tag);
      else ctx.openLayer(view, tag, j.chart === "update_ratio" ? "update" : null);
      return;
    }
  }
  // Evidence on the overview: a metric chart, one chart of a view's row, or the row.
  const metric = j.metric || f.metric;
  const charts = { stack: "stack", rms: "rms-bands", activity: "activity" };
  let target = null;
  if (metric) target = ctx.root.querySelector(`.chart[data-chart="${CSS.escape(`metric-${metric}`)}"]`);
  // The Transformer section's charts are named by the rules (probes-attn, probes-head, ...).
  if (!target && /^probes-/.test(j.chart || "")) {
    target = ctx.root.querySelector(`.chart[data-chart="${CSS.escape(j.chart)}"]`) || ctx.root.querySelector("#sec-transformer");
  }
  if (!target && view && charts[j.chart]) target = ctx.root.querySelector(`.chart[data-chart="${view}-${charts[j.chart]}"]`);
  if (!target && view) target = ctx.root.querySelector(`#sec-${view}`);
  if (!target && (metric || /loss|metric/.test(f.kind))) target = ctx.root.querySelector("#sec-metrics");
  if (!target) target = ctx.root.querySelector("#sec-gradient") || ctx.root.querySelector("#sec-metrics");
  if (target) {
    target.scrollIntoView({ block: "center" });
    target.classList.remove("flash");
    void target.offsetWidth; // restart the animation
    target.classList.add("flash");
  }
  ctx.status(`Evidence: ${f.title}${view ? ` — ${VIEW_LABELS[view]}` : ""}`);
}
