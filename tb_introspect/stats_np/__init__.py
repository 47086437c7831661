"""Numpy twin of the TensorFlow statistics engine ``tb_introspect.stats`` (no TensorFlow).

The same algebra of states: ``tensor_state`` (one array), ``merge_states`` and
``finalize`` (the packed vector, ``slots.tensor_stats_fields``), so
``tensor_stats(x)`` is ``finalize(tensor_state(x))``. PyTorch's device segments
(``torch/state.py``) become these states on the host, and the numpy writer finalizes them
too. Its modules mirror ``tb_introspect.stats``: ``state`` (the states), ``vector`` (the
packed vector), ``quantiles`` (percentiles from a sample), and ``two_points`` (the view
slots computed from two points: ``update_ratio``, ``implicit_lr`` and ``cos_prev``).

Definitions as in ``docs/statistics.md``: percentiles are exact when the tensor has at most
``sample_size`` finite non-zero values (or ``sample_size=None``), otherwise they come from a
uniform sample of that many finite non-zero values combined with the exact sign/zero counts.

    >>> import numpy as np
    >>> from tb_introspect import stats_np
    >>> int(stats_np.tensor_stats(np.arange(4.0), "variable")[0])  # the count slot
    4
"""

from tb_introspect.stats_np.quantiles import Sorted, sample_quantiles
from tb_introspect.stats_np.state import (
    BATCH_MAX,
    DEFAULT_SAMPLE_SIZE,
    PACKED_SCALARS,
    STATE_MERGE,
    State,
    check_quantiles,
    empty_state,
    flat64,
    merge_states,
    pack_state,
    packed_length,
    scale_exponent,
    scale_exponents,
    state_exp,
    tensor_state,
    tensor_states,
    unpack_state,
)
from tb_introspect.stats_np.two_points import (
    ILR_SAMPLE,
    cos_prevs,
    cosine_of_sums,
    ilr_merge,
    ilr_quantiles,
    ilr_shard_sample,
    implicit_lrs,
    update_ratio_of_sums,
    update_ratios,
)
from tb_introspect.stats_np.vector import finalize, finalize_many, tensor_stats, tensor_stats_many

__all__ = [
    "BATCH_MAX", "DEFAULT_SAMPLE_SIZE", "ILR_SAMPLE", "PACKED_SCALARS", "STATE_MERGE", "Sorted",
    "State", "check_quantiles", "cos_prevs", "cosine_of_sums", "empty_state", "finalize",
    "finalize_many", "flat64", "ilr_merge", "ilr_quantiles", "ilr_shard_sample",
    "implicit_lrs", "merge_states", "pack_state", "packed_length", "sample_quantiles",
    "scale_exponent", "scale_exponents", "state_exp", "tensor_state", "tensor_states",
    "tensor_stats", "tensor_stats_many", "unpack_state", "update_ratio_of_sums",
    "update_ratios",
]
