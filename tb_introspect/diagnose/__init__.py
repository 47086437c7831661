"""Automatic findings: training pathologies detected from a run's logged statistics.

Entry points (numpy only, no TensorFlow, no plugin import):

* :func:`find_issues` ``(run_series) -> list[Finding]``, most severe first, from a
  :class:`~tb_introspect.read.series.RunSeries`; the plugin's overview and
  ``tb-introspect diagnose`` both call it;
* :func:`findings_json` - the JSON form both of them serve;
* :func:`format_findings` - the plain-text report ``tb-introspect diagnose`` prints.

Rules and thresholds are documented in ``docs/findings.md``; where the findings sit
between the training step and the chart in ``docs/design.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tb_introspect.diagnose import (  # noqa: F401
    activity,
    classification,
    config,
    flow,
    gradients,
    loss,
    nonfinite,
    overfitting,
    symmetry,
    transformer,
    updates,
    weights,
)
from tb_introspect.diagnose.core import (
    DEFAULT_THRESHOLDS,
    RULES,
    SEVERITY_RANK,
    Finding,
    Rule,
    RunView,
    Thresholds,
)
from tb_introspect.read.series import RunSeries

__all__ = [
    "DEFAULT_THRESHOLDS",
    "RULES",
    "Finding",
    "Rule",
    "Thresholds",
    "find_issues",
    "findings_json",
    "format_findings",
]


def find_issues(
    run: RunSeries,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    rules: Sequence[str] | None = None,
) -> list[Finding]:
    """All findings of ``run``, most severe first, then by first step.

    Only rules whose inputs were logged run. Rules that need a history but
    have fewer than ``thresholds.min_points`` points are skipped and reported
    together in one ``insufficient_data`` info finding. ``rules`` narrows the
    rules to those names.
    """
    rv = RunView(run, thresholds)
    findings: list[Finding] = []
    short: list[str] = []
    most = 0
    for r in RULES:
        if rules is not None and r.name not in rules:
            continue
        if not r.applicable(rv):
            continue
        if r.needs_history:
            n = r.n_points(rv)
            if n < thresholds.min_points:
                short.append(r.name)
                most = max(most, n)
                continue
        findings.extend(r.check(rv))
    for f in findings:
        if f.kind in thresholds.provisional and f.severity == "warning":
            # Not yet validated on a real training with the pathology: said, not warned.
            f.severity = "info"
            f.evidence["provisional"] = True
            f.explanation += (" (This check's warning is provisional: it has not yet been"
                              " shown on a real training with the pathology, so it is"
                              " reported as info.)")
    if rv.step_based:  # a run measured in steps names its findings by step
        for f in findings:
            f.first_epoch = None
    if short:
        findings.append(_insufficient(short, most, thresholds.min_points))
    return sort_findings(findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first; then earliest first step (unknown last); stable otherwise."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY_RANK[f.severity],
                       f.first_step if f.first_step is not None else float("inf")),
    )


def _insufficient(rules: list[str], have: int, need: int) -> Finding:
    return Finding(
        kind="insufficient_data",
        severity="info",
        title=(f"Too few logged points to judge {len(rules)} check(s)"
               f" (have {have}, need {need})"),
        evidence={"points": have, "points_needed": need, "checks": ", ".join(rules)},
        explanation=(
            "Trend and 'sustained' checks need a few logged points before they can tell a"
            " pathology from noise, so they stay silent until then instead of guessing."
            f" Skipped: {', '.join(rules)}."
        ),
        suggestion="Train longer, or log more often (e.g. every=N steps instead of per epoch).",
        jump={"tab": "overview"},
    )


def findings_json(findings: Iterable[Finding]) -> list[dict]:
    """JSON-ready dicts of ``findings`` (the overview's ``findings`` array)."""
    return [f.to_json() for f in findings]


_MARK = {"critical": "CRITICAL", "warning": "WARNING ", "info": "info    "}


def format_findings(by_run: dict[str, list[Finding]], verbose: bool = False) -> str:
    """A plain-text report of ``{run: findings}``; ``verbose`` adds explanations and advice."""
    import textwrap

    lines: list[str] = []
    for run, findings in by_run.items():
        counts = {s: sum(f.severity == s for f in findings) for s in SEVERITY_RANK}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
        lines.append(f"run {run}: {summary}")
        for f in findings:
            when = []
            if f.first_epoch is not None:
                when.append(f"epoch {f.first_epoch}")
            if f.first_step is not None:
                when.append(f"step {f.first_step}")
            where = f" [{', '.join(when)}]" if when else ""
            lines.append(f"  {_MARK[f.severity]} {f.kind}: {f.title}{where}")
            if f.layers:
                more = f" (+{len(f.layers) - 6} more)" if len(f.layers) > 6 else ""
                lines.append(f"           layers: {', '.join(f.layers[:6])}{more}")
            if verbose:
                ev = ", ".join(f"{k}={v}" for k, v in f.to_json()["evidence"].items())
                for label, text in (("evidence", ev), ("why", f.explanation),
                                    ("try", f.suggestion)):
                    if text:
                        lines.extend(textwrap.wrap(f"{label}: {text}", 96,
                                                   initial_indent="           ",
                                                   subsequent_indent="             "))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
