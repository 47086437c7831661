"""In-graph statistics of tensors (TensorFlow): one engine of states, merge and finalize.

Everything here runs eagerly, under ``tf.function`` and with ``jit_compile=True``.
Definitions, edge cases and the accuracy statement are in ``docs/statistics.md``;
``tb_introspect.stats_np`` is the numpy twin with the same definitions.

A *state* (``state.py``) holds exact counts, moments, extremes and per-unit non-zero
counts, plus a bounded uniform sample of the finite non-zero values (``sample.py``).
States come from one batch (``batch_state``, in the training step), merge
(``merge_pair``), and ``finalize`` (``vector.py``) turns any of them into the packed
vector. ``tensor_stats`` is the state of one tensor, finalized. A logged point reads its
states to the host and finalizes them there with the numpy twin (``finalize_rows``,
``host.py``).

Example (a training step's batches, each ``[rows, channels]``, its canonical shape)::

    import tensorflow as tf
    from tb_introspect import stats

    state = stats.empty_state([None, 16], sample_size=1024)
    for _ in range(3):
        state = stats.merge_pair(state, stats.batch_state(tf.random.normal([32, 16]), 1024))
    vector = stats.finalize(state, "output")   # same layout as stats.tensor_stats
"""

from tb_introspect.stats.host import finalize_rows, numpy_states
from tb_introspect.stats.numeric import DEFAULT_SAMPLE_SIZE, to_float
from tb_introspect.stats.shapes import as_canonical, canonical_shape
from tb_introspect.stats.state import (
    STATE_MERGE,
    activity_state,
    batch_state,
    empty_state,
    exact_state,
    merge_pair,
    merge_stacked,
    with_sample,
)
from tb_introspect.stats.vector import finalize, tensor_stats, with_extra_slots

__all__ = [
    "DEFAULT_SAMPLE_SIZE",
    "STATE_MERGE",
    "activity_state",
    "as_canonical",
    "batch_state",
    "canonical_shape",
    "empty_state",
    "exact_state",
    "finalize",
    "finalize_rows",
    "merge_pair",
    "merge_stacked",
    "numpy_states",
    "tensor_stats",
    "to_float",
    "with_extra_slots",
    "with_sample",
]
