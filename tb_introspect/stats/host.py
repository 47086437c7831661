"""The engine's states read to the host and finalized by the numpy twin.

A logged point copies its merged states to the host once and finalizes them with
``stats_np.finalize_many``, as the PyTorch front-end does: a traced finalize cost seconds
of tracing per process for what numpy computes in milliseconds, and one formula per slot
(``stats_np``) then serves both front-ends. The engine's layout differs from numpy's in
two ways only: a sample is ``k`` fixed slots (+inf keys and values in the empty ones, which
``finalize_many`` skips), and the per-unit counts may be zero-padded past the real units
(``channels`` / ``positions`` say how many are real, and a zero count is never active).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tb_introspect import slots, stats_np
from tb_introspect.stats.state import STATE_MERGE


def numpy_states(stacked: Mapping[str, np.ndarray]) -> list[stats_np.State]:
    """One ``stats_np`` state per row of engine states stacked on a leading axis (numpy
    arrays: scalars ``[n]``, counts and samples ``[n, width]``)."""
    missing = set(STATE_MERGE) - set(stacked)
    if missing:
        raise ValueError(f"not a tb_introspect statistics state: missing {sorted(missing)}")
    arrays = {key: np.asarray(stacked[key], np.float64) for key in STATE_MERGE}
    keys, values = arrays.pop("sample_keys"), arrays.pop("sample_values")
    k = np.float64(keys.shape[-1])
    out = []
    for i in range(keys.shape[0]):
        taken = np.isfinite(keys[i])  # numpy samples hold only taken entries
        out.append(dict({key: value[i] for key, value in arrays.items()}, sample_size=k,
                        sample_keys=keys[i][taken], sample_values=values[i][taken]))
    return out


def finalize_rows(stacked: Mapping[str, np.ndarray], view: str, *,
                  quantiles: Sequence[float] = slots.DEFAULT_QUANTILES) -> np.ndarray:
    """``[n, slots]``: the packed vector of each stacked engine state (``stats.finalize``'s
    slots, computed by ``stats_np.finalize_many``; ``epoch`` and the view's extra slots
    NaN)."""
    return stats_np.finalize_many(numpy_states(stacked), view, quantiles=quantiles)
