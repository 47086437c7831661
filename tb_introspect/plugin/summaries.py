"""The first screen from the VIEW_SUMMARY tags (format version 3).

A view summary holds, per logged point, the few slots the Overview draws for every tensor
of its view (``slots.SUMMARY_FIELDS``). Reading 4 such tags instead of one tag per
tensor is what makes the first screen of a long run fast: TensorBoard's data provider
converts every point to numpy one proto at a time, so the cost is in the number of protos.

A view's summary is used only when its rows name every TENSOR_STATS tag of the view that
the run lists (a tensor first logged after the summary's first point, or a run written
partly by a writer without summaries, falls back to the per-tensor tags for that run), and
when every point holds those rows (``row_key``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from tb_introspect import slots
from tb_introspect.read import provider
from tb_introspect.read.series import RunSeries, Series, TagInfo


def covering(infos: Mapping[str, TagInfo]) -> dict[str, TagInfo] | None:
    """The summary tag of each view that has tensors, when every such view has one whose rows
    name all of the view's TENSOR_STATS tags; ``None`` otherwise (read the per-tensor tags)."""
    tensors: dict[str, set[str]] = {}
    found: dict[str, TagInfo] = {}
    for info in infos.values():
        if info.kind == provider.KIND_TENSOR_STATS:
            tensors.setdefault(info.view, set()).add(info.tag)
        elif info.kind == provider.KIND_VIEW_SUMMARY:
            found[info.view] = info
    if not tensors:
        return None
    for view, tags in tensors.items():
        s = found.get(view)
        if s is None or not tags <= set(s.rows):
            return None
    return {view: found[view] for view in tensors}


def mismatch(summary: Series) -> str | None:
    """Why the points of ``summary`` do not hold the rows its metadata names (their
    ``row_key`` slots differ: another model written into the same run directory), or None."""
    rows = summary.info.rows
    if "row_key" not in summary.info.fields:
        return "no row_key slot"
    col = summary.info.fields.index("row_key")
    keys = summary.values.reshape(len(summary), len(rows), len(summary.info.fields))[:, :, col]
    want = np.array([slots.row_key(t) for t in rows])
    bad = np.flatnonzero((keys != want).any(axis=1))
    if bad.size:
        return f"rows at step {int(summary.steps[bad[0]])} are not the rows of its metadata"
    return None


def expand(summary: Series, infos: Mapping[str, TagInfo]) -> list[Series]:
    """One series per row of a summary's points.

    Each carries its tensor's listing entry with the summary's fields, so the overview,
    which reads fields by name, computes on it as on the tensor's own tag.
    """
    fields = summary.info.fields
    width = len(fields)
    flat = summary.values.reshape(len(summary), len(summary.info.rows), width)
    out = []
    for r, tag in enumerate(summary.info.rows):
        info = infos.get(tag)
        if info is None or info.kind != provider.KIND_TENSOR_STATS:
            continue  # a row whose tag is not listed (yet): nothing to place it under
        row_info = dataclasses.replace(info, fields=fields, quantiles=summary.info.quantiles)
        # A view of the summary's block, no copy: the rows share its memory.
        out.append(Series(info=row_info, steps=summary.steps, wall_times=summary.wall_times,
                          values=flat[:, r, :]))
    return out


def summary_run(run: str, infos: Mapping[str, TagInfo], summaries: Mapping[str, Series],
                metrics: Mapping[str, Series], skipped: list[tuple[str, str]]) -> RunSeries:
    """The run as the first screen sees it: per view the summary's rows, and the metrics."""
    rows = {r.info.tag: r for s in summaries.values() for r in expand(s, infos)}
    return provider.assemble_run(run, infos, {**metrics, **rows}, skipped)
