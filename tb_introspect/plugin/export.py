"""One tag's series as a file to download (``./export``): CSV or JSON, every point the read
holds, with the step, the epoch, the wall time and every slot of the tag's layout."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from tb_introspect.plugin.http_io import encode, int_list, num_list
from tb_introspect.read.provider import KIND_TENSOR_STATS
from tb_introspect.read.series import Series

#: The formats ``./export`` writes, by ``format=`` value: (MIME type, file extension).
FORMATS = {"csv": ("text/csv; charset=utf-8", "csv"), "json": ("application/json", "json")}


def columns(s: Series) -> list[str]:
    """The slots of ``s`` in layout order (``epoch`` has its own column)."""
    return [f for f in s.info.fields if f != "epoch" and s.has(f)]


def csv_bytes(s: Series) -> bytes:
    """``step,epoch,wall_time,<slot>...``: one row per point. Non-finite values are written
    ``nan``, ``inf`` and ``-inf`` (what numpy and pandas read back); an unknown epoch is
    empty."""
    fields = columns(s)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["step", "epoch", "wall_time", *fields])
    data = [s.field(f) for f in fields]
    epochs = int_list(s.epochs)
    for k, step in enumerate(s.steps.tolist()):
        w.writerow([step, "" if epochs[k] is None else epochs[k], repr(float(s.wall_times[k])),
                    *(repr(float(d[k])) for d in data)])
    return out.getvalue().encode("utf-8")


def series_json(s: Series, fields: list[str], sampled: bool = False) -> dict[str, Any]:
    """One series as ``./series`` answers it: ``fields`` of it, or every slot when empty
    (NaN and infinities as null, as every route)."""
    i = s.info
    out: dict[str, Any] = {"kind": i.kind, "name": i.name, "sampled": sampled}
    if i.kind == KIND_TENSOR_STATS:
        out.update({
            "view": i.view, "layer": i.layer, "depth": i.depth, "shape": list(i.shape),
            "dtype": i.dtype, "cadence": i.cadence, "quantiles": num_list(i.quantiles),
        })
    wanted = fields or columns(s)
    out["steps"] = s.steps.tolist()
    out["epochs"] = int_list(s.epochs)
    out["wall_times"] = num_list(s.wall_times)
    out["values"] = {f: num_list(s.field(f)) for f in wanted if s.has(f)}
    return out


def json_bytes(run: str, s: Series, sampled: bool) -> bytes:
    """The file: the series of ``./series`` with its run and tag."""
    return encode({"run": run, "tag": s.info.tag, **series_json(s, [], sampled)})


def filename(run: str, tag: str, ext: str) -> str:
    """A portable file name: ``<run>__<tag>.<ext>`` with every other character as ``_``."""
    tag = tag.removeprefix("introspect/")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{run}__{tag}").strip("._") + f".{ext}"
