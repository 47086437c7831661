"""The ``./run`` document of a run (docs/http_api.md): its tensors by view, metrics,
activity maps and probes, from its listing and its sampled read."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tb_introspect import metadata, slots
from tb_introspect.plugin import activity, probes
from tb_introspect.plugin.http_io import int_list, num_list
from tb_introspect.read.series import RunSeries, Series, TagInfo


def document(
    rs: RunSeries, sampled: frozenset[str], infos: dict[str, TagInfo]
) -> dict[str, Any]:
    """The ``./run`` JSON of a run (see docs/http_api.md); ``sampled``: tags read in part,
    ``infos``: the run's listing (activity maps are listed from it, never read here)."""
    views: dict[str, list] = {v: [] for v in slots.VIEWS}
    for view, series in rs.tensors.items():
        views[view] = [tensor_entry(s, s.info.tag in sampled, infos.get(s.info.tag, s.info))
                       for s in series]
    dead = {s.info.name: last_finite(s.field("dead_rate")) for s in rs.tensors.get("output", [])}
    maps = activity.entries(infos, dead)
    by_name = {m["name"]: m["tag"] for m in maps}
    for entry in views["output"]:
        entry["activity_tag"] = by_name.get(entry["name"])
    names = sorted(set(rs.metrics) | set(rs.metric_epochs))
    return {
        "run": rs.run,
        "format_version": rs.format_version,
        "reader_version": metadata.PROTO_VERSION,
        "views": views,
        "metrics": [metric_entry(n, rs.metrics.get(n), rs.metric_epochs.get(n), sampled)
                    for n in names],
        "activity": maps,
        "probes": probes.listing(infos),
        "skipped": [{"tag": t, "reason": r} for t, r in rs.skipped],
    }


def last_finite(values) -> float:
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def tensor_entry(s: Series, sampled: bool, i: TagInfo) -> dict[str, Any]:
    """``./run``'s entry of one tensor: ``i`` is its listing (the layout of its own tag;
    ``s`` may be a view summary's row)."""
    epochs = s.epochs
    return {
        "tag": i.tag, "name": i.name, "layer": i.layer, "depth": i.depth,
        "shape": list(i.shape), "dtype": i.dtype, "cadence": i.cadence,
        "fields": list(i.fields), "quantiles": num_list(i.quantiles),
        # Unknown without reading every point: null when the tag holds more than the sample.
        "num_points": None if sampled else len(s),
        "first_step": int(s.steps[0]) if len(s) else None,
        "last_step": int(s.steps[-1]) if len(s) else None,
        "first_epoch": int_list(epochs[:1])[0] if len(s) else None,
        "last_epoch": int_list(epochs[-1:])[0] if len(s) else None,
    }


def metric_entry(
    name: str, step: Series | None, per_epoch: Series | None,
    sampled: frozenset[str],
) -> dict[str, Any]:
    main = step if step is not None else per_epoch
    cut = step is not None and step.info.tag in sampled
    return {
        "name": name,
        "tag": step.info.tag if step is not None else None,
        "epoch_tag": per_epoch.info.tag if per_epoch is not None else None,
        "num_points": None if cut else len(step) if step is not None else 0,
        "first_step": int(main.steps[0]) if len(main) else None,
        "last_step": int(main.steps[-1]) if len(main) else None,
        "num_epochs": len(per_epoch) if per_epoch is not None
        else len({e for e in int_list(step.epochs) if e is not None}),
    }
