"""Plain JSON values from numpy data: NaN and ±Inf become ``None`` (JSON ``null``).

JSON has no NaN, and a run's statistics have plenty (a layer without a point at a step, a
diverged loss). The plugin's routes, the findings (``Finding.to_json``) and
``tb-introspect diagnose --json`` all convert through this one module (no TensorFlow).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def num_list(values: Any, decimals: int | None = None) -> list:
    """A (nested) list of floats with NaN and ±Inf as ``None``; vectorised for large arrays."""
    a = np.asarray(values, dtype=np.float64)
    if decimals is not None:
        a = np.round(a, decimals)
    finite = np.isfinite(a)
    if finite.all():
        return a.tolist()
    out = a.astype(object)
    out[~finite] = None
    return out.tolist()


def int_list(values: Any) -> list:
    """A list of Python ints, ``None`` where the input is not finite."""
    a = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(a)
    out = np.where(finite, a, 0).astype(np.int64).astype(object)
    out[~finite] = None
    return out.tolist()


def round_sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits."""
    if x == 0 or not math.isfinite(x):
        return x
    x = float(x)  # numpy's round returns inf where Python's raises
    try:
        return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))
    except OverflowError:  # near the float maximum, the rounded value is out of range
        return x


def jsonable(obj: Any, digits: int | None = None) -> Any:
    """A copy of ``obj`` of JSON types only.

    numpy values become Python ones, non-finite floats ``None``, tuples and sets lists,
    other objects their ``str``; with ``digits``, floats keep that many significant digits
    (findings' evidence stays readable). Nested data of other modules goes through here;
    large arrays are faster through :func:`num_list`.
    """
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        return obj if digits is None else round_sig(obj, digits)
    if isinstance(obj, np.generic):
        return jsonable(obj.item(), digits)
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), digits)
    if isinstance(obj, dict):
        return {str(k): jsonable(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v, digits) for v in obj]
    return str(obj)
