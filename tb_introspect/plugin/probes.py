"""The ``./probes`` document: a run's transformer probes per row and field (format 4).

The values come from :func:`tb_introspect.read.series.probes_of` (the one reader of the PROBES
tag, which the findings use too), with the massive-activation ratio max|a| / abs_median
computed there from the output view. JSON shape: ``docs/http_api.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tb_introspect import metadata, schema, slots
from tb_introspect.read.json_values import int_list, num_list
from tb_introspect.read.series import PROBE_DERIVED_FIELDS, Probes, RunSeries, TagInfo, probes_of

#: Every field ``./probes`` can serve, in order.
FIELDS: tuple[str, ...] = slots.PROBE_VALUE_FIELDS + PROBE_DERIVED_FIELDS


def listing(infos: Mapping[str, TagInfo]) -> dict[str, Any] | None:
    """``./run``'s ``probes`` entry from a run's tag listing (no read): the tag and its rows,
    or None when the run has no probes."""
    info = infos.get(metadata.probes_tag())
    if info is None:
        return None
    return {"tag": info.tag, "rows": list(info.rows), "cadence": info.cadence}


def document(run: str, rs: RunSeries, fields: Sequence[str] = ()) -> dict[str, Any]:
    """The ``./probes`` JSON of ``run``: per field, one list of values per row (``null``
    where the probe does not apply), on the probes' steps. ``fields`` narrows the fields
    (default: all); rows where every requested field is ``null`` are left out. A run without
    probes has no rows."""
    fields = tuple(fields) or FIELDS
    p = probes_of(rs)
    doc: dict[str, Any] = {
        "run": run,
        "fields": list(fields),
        "references": dict(schema.PROBE_REFERENCES),
        "steps": [], "epochs": [], "cadence": None, "rows": [], "values": {f: [] for f in fields},
    }
    if p is None:
        return doc
    keep = [i for i in range(len(p.rows))
            if any(np.isfinite(p.field(f)[i]).any() for f in fields)]
    depth = _output_depths(rs)
    doc.update(
        steps=int_list(p.steps), epochs=int_list(p.epochs), cadence=p.cadence,
        rows=[{"name": p.rows[i], "kind": _row_kind(p, i), "depth": depth.get(p.rows[i])}
              for i in keep],
        values={f: [num_list(p.field(f)[i]) for i in keep] for f in fields},
    )
    return doc


def _row_kind(p: Probes, i: int) -> str:
    """``attention``, ``head`` or ``output``: which probes a row has (the tab's legends)."""
    if np.isfinite(p.field("attn_logit_max")[i]).any():
        return "attention"
    if np.isfinite(p.field("logit_max")[i]).any() or np.isfinite(p.field("logit_lse")[i]).any():
        return "head"
    return "output"


def _output_depths(rs: RunSeries) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in rs.tensors.get("output", []):
        out.setdefault(s.info.name, s.info.depth)
        out.setdefault(s.info.layer, s.info.depth)
    return out
