"""The ``./activity`` document: one layer output's per-epoch activity map (no TensorFlow).

An ACTIVITY_MAP point holds the activation rate of every channel and of every spatial
position of one layer output over one epoch (``docs/format.md``): up to tens of thousands
of values, so these tags stay out of the run's sampled read and are read one tag at a
time, on demand, by the ``./activity`` route.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tb_introspect.read import provider
from tb_introspect.read.json_values import int_list, num_list
from tb_introspect.read.series import Series, TagInfo

#: Decimals of a rate in the JSON (0.01 % steps; a 1,000-sample epoch resolves 0.1 %).
RATE_DECIMALS = 4


def is_activity(info: TagInfo) -> bool:
    """Whether ``info`` is an activity-map tag (read only through ``./activity``)."""
    return info.kind == provider.KIND_ACTIVITY_MAP


def widths(info: TagInfo) -> tuple[int, int]:
    """``(channels, positions)`` of an activity map, from its layout alone (no points)."""
    channels = sum(1 for f in info.fields if f[:1] == "c" and f[1:].isdigit())
    positions = sum(1 for f in info.fields if f[:1] == "s" and f[1:].isdigit())
    return channels, positions


def spatial_shape(shape: Sequence[int], positions: int) -> list[int]:
    """The map's spatial axes: ``[H, W]`` of a ``[-1, H, W, C]`` output, ``[L]`` of a
    sequence, ``[]`` without positions; ``[positions]`` when the static shape does not
    account for them (unknown sizes)."""
    if positions <= 0:
        return []
    axes = [int(d) for d in shape[1:-1]]
    if axes and all(d > 0 for d in axes) and math.prod(axes) == positions:
        return axes
    return [positions]


def entries(infos: Mapping[str, TagInfo], dead_rates: Mapping[str, float]) -> list[dict]:
    """The ``activity`` list of ``./run``: every activity map of the run in depth order.

    ``dead_rates``: the last finite ``dead_rate`` of the output statistics by tensor name
    (the frontend's default layer is the one with the highest).
    """
    out = []
    for info in sorted((i for i in infos.values() if is_activity(i)), key=TagInfo.sort_key):
        channels, positions = widths(info)
        dead = dead_rates.get(info.name)
        out.append({
            "tag": info.tag, "name": info.name, "layer": info.layer, "depth": info.depth,
            "shape": list(info.shape), "channels": channels, "positions": positions,
            "spatial_shape": spatial_shape(info.shape, positions),
            "last_step": info.max_step if info.max_step >= 0 else None,
            "final_dead_rate": None if dead is None or not math.isfinite(dead) else dead,
        })
    return out


def rates(values: np.ndarray) -> list:
    """Rates rounded to RATE_DECIMALS, NaN as null. A rate that rounding would turn into
    exactly 0 (a dead channel or position) or 1 (never zero) is sent unrounded."""
    a = np.asarray(values, dtype=np.float64)
    out = np.round(a, RATE_DECIMALS)
    crossed = ((a > 0) & (out <= 0)) | ((a < 1) & (out >= 1))
    out[crossed] = a[crossed]
    return num_list(out)


def document(run: str, s: Series, sampled: bool = False) -> dict[str, Any]:
    """The ``./activity`` JSON of one activity-map series (see docs/http_api.md)."""
    info = s.info
    channels, positions = widths(info)
    cols = {f: i for i, f in enumerate(info.fields)}
    c_idx = [cols[f"c{i}"] for i in range(channels)]
    s_idx = [cols[f"s{i}"] for i in range(positions)]
    return {
        "run": run, "tag": info.tag, "name": info.name, "layer": info.layer,
        "depth": info.depth, "shape": list(info.shape), "version": info.version,
        "channels": channels, "positions": positions,
        "spatial_shape": spatial_shape(info.shape, positions),
        "epochs": int_list(s.field("epoch")),
        "steps": s.steps.tolist(),
        "samples": num_list(s.field("samples"), 1),
        "channel_rates": [rates(row) for row in s.values[:, c_idx]],
        "spatial_rates": [rates(row) for row in s.values[:, s_idx]],
        "sampled": sampled,
    }
