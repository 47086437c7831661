"""Shape-polymorphic ``tf.function`` wrappers of the ``stats`` kernels.

One statistics computation is a graph of about a thousand ops; inlining one per
monitored tensor makes a ResNet's train step take minutes to trace. Here every
kernel is a nested ``tf.function`` with unknown dimensions in its input signature,
traced once per (kind, dtype) and called from the outer graphs as a single op,
whatever the number of tensors. Nothing of a logged point is here: its statistics
are taken on the host (``point_graph.py``).

Layer outputs are brought to a canonical rank first: ``[batch, channels]`` or
``[batch, positions, channels]`` (all spatial/time axes flattened into one, which
leaves the dead rates unchanged).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tb_introspect import stats
from tb_introspect.keras import private
from tb_introspect.stats import sample

_SEED = tf.TensorSpec([2], tf.int64)
# Outside XLA, nested function calls are inlined into the caller before graph
# optimisation, which makes that cost grow with the number of call sites again
# (docs/benchmarks.md, the first fit); "_noinline" keeps one copy.
_NOINLINE = {"_noinline": True}


def _attrs(xla: bool) -> dict | None:
    return None if xla else _NOINLINE


def activation_shape(shape: Sequence[int | None]) -> tuple[int | None, ...]:
    """Canonical shape (``stats.canonical_shape``, batch unknown) of a layer output of
    static ``shape``. A layer output's axis 0 is its batch, so one of rank <= 1, or of
    unknown channel count, is values of one unit."""
    shape = list(shape)
    if len(shape) <= 1 or shape[-1] is None:
        return (None, 1)
    return stats.canonical_shape(shape)


def as_activation(x: tf.Tensor, canonical: Sequence[int | None]) -> tf.Tensor:
    """A layer output reshaped to its canonical shape (see ``activation_shape``)."""
    if x.shape.rank <= 1:
        return tf.reshape(x, [-1, 1])
    if len(canonical) == 3 and canonical[1] and canonical[2]:
        return tf.reshape(x, [-1, canonical[1], canonical[2]])  # one op, the shape constant
    return stats.as_canonical(x, canonical)


@functools.cache
def activation_parts_fn(rank: int, dtype: str, sample_size: int, xla: bool):
    """``(x[canonical], seed) -> state`` of one layer output (``stats.batch_state``)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None] * rank, tf.as_dtype(dtype)), _SEED],
        autograph=False, jit_compile=True if xla else None, experimental_attributes=_attrs(xla),
    )
    def activation_parts(x, seed):
        return stats.batch_state(x, sample_size, seed)

    return activation_parts


def pad_state(state: dict[str, tf.Tensor], channels: int, positions: int
              ) -> dict[str, tf.Tensor]:
    """Channel/position counts zero-padded to common widths, so states of different
    tensors stack."""
    out = dict(state)
    for key, width in (("channel_nnz", channels), ("spatial_nnz", positions)):
        t = state[key]
        out[key] = tf.pad(t, [[0, width - int(t.shape[0])]])
    return out


# ------------------------------------------------------------------ many tensors, one call


class Segments:
    """Tensors of one float dtype, flattened one after the other into one vector: what the
    batched kernels below read. A nested function's call site cost the first call of the
    step its own instantiation and optimization (a model with hundreds of tensors paid
    seconds of its first fit for them); one call per group of tensors costs that once,
    however large the model.

    ``tensors``: (row, canonical tensor) pairs, all of ``dtype`` after ``stats.to_float``.
    ``units``: ``[N, 2]`` (positions, channels) of each canonical shape (positions 0: a
    ``[B, C]`` tensor)."""

    def __init__(self, tensors: Sequence[tuple[int, tf.Tensor]]):
        self.rows = [j for j, _ in tensors]
        values = [tf.reshape(stats.to_float(t), [-1]) for _, t in tensors]
        self.values = tf.concat(values, 0) if len(values) > 1 else values[0]
        self.sizes = tf.stack([tf.size(v, out_type=tf.int64) for v in values])
        self.units = tf.constant([[t.shape[1] if t.shape.rank == 3 else 0, t.shape[-1]]
                                  for _, t in tensors], tf.int64)

    @property
    def dtype(self) -> str:
        return self.values.dtype.name

    def seed(self, base: tf.Tensor, salt: int) -> tf.Tensor:
        """``base + [salt, first row]``: the seed of the group's samples (one draw)."""
        return base + tf.constant([salt, self.rows[0]], tf.int64)


def call(fn: Callable, *args: tf.Tensor) -> Any:
    """``fn(*args)`` in a traced step, for the batched kernels: each call's instantiation
    skips Grappler, and Grappler does not see through its inputs. Grappler specializes a
    nested function called with a constant input to its call site (a copy of its graph
    per call), and optimizing a loop over a model's outputs took 0.5 to 0.7 s a copy, more
    than it saves on the statistics steps of a whole training."""
    with private.without_graph_optimization():
        return fn(*[tf.raw_ops.PlaceholderWithDefault(input=a, shape=a.shape)
                    for a in args])


def group_by_dtype(tensors: dict[int, tf.Tensor]) -> list[Segments]:
    """The stashed canonical tensors (by row), in row order, one ``Segments`` per float
    dtype they compute in (float32, float64)."""
    groups: dict[str, list[tuple[int, tf.Tensor]]] = {}
    for j in sorted(tensors):
        t = tensors[j]
        groups.setdefault(stats.to_float(t).dtype.name, []).append((j, t))
    return [Segments(g) for g in groups.values()]


def segment(values: tf.Tensor, sizes: tf.Tensor, i: tf.Tensor) -> tf.Tensor:
    """The ``i``-th tensor of a ``Segments``' values, flat."""
    start = tf.reduce_sum(sizes[:i])
    return tf.slice(values, tf.reshape(start, [1]), sizes[i:i + 1])


@functools.cache
def activation_states_fn(dtype: str, sample_size: int, channels: int, positions: int):
    """``(values, sizes, units, seed) -> {key: [N, ...]}``: ``stats.batch_state`` of each
    tensor of a ``Segments``, its counts zero-padded to ``channels`` and ``positions`` (the
    ``BatchLayout`` row widths). One loop in one nested function for the exact parts (its
    graph is traced once, whatever the number of tensors), then one ``sample.draw`` for
    every tensor's sample: drawn one tensor at a time, the samples' small ops were a fifth
    of MobileNetV2's statistics step."""
    width = max(positions, 1)
    shapes = _row_shapes(sample_size, channels, positions)
    spec = {k: tf.TensorSpec(shape, tf.float64) for k, shape in shapes.items()
            if k not in _SAMPLED}

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.as_dtype(dtype)),
                         tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 2], tf.int64),
                         _SEED],
        autograph=False, experimental_attributes=_NOINLINE,
    )
    def activation_states(values, sizes, units, seed):
        def one(i):
            p, c = units[i, 0], units[i, 1]
            # A [B, C] tensor is taken as [B, 1, C]: the same values in the same order;
            # its positions and position counts are then zero, as its own kernel's.
            x = tf.reshape(segment(values, sizes, i), tf.stack([-1, tf.maximum(p, 1), c]))
            st, _ = stats.exact_state(x)
            spatial = tf.pad(st["spatial_nnz"], [[0, width - tf.maximum(p, 1)]])[:positions]
            st["spatial_nnz"] = tf.where(p > 0, spatial, tf.zeros_like(spatial))
            st["positions"] = tf.where(p > 0, st["positions"], 0.0)
            st["channel_nnz"] = tf.pad(st["channel_nnz"], [[0, channels - c]])
            return {k: tf.ensure_shape(tf.cast(st[k], tf.float64), spec[k].shape)
                    for k in spec}

        st = tf.map_fn(one, tf.range(tf.size(sizes, out_type=tf.int64)),
                       fn_output_signature=spec)
        # What the sample draws from: the values, their non-finite ones set to 0.
        z = tf.cond(tf.reduce_all(tf.equal(st["finite_count"], st["count"])),
                    lambda: values,
                    lambda: tf.where(tf.math.is_finite(values), values, tf.zeros_like(values)))
        nnz = tf.reduce_sum(st["channel_nnz"], axis=1)
        vals, keys = sample.draw(z, sizes, nnz, sample_size, seed, sample.FEW_HITS)
        return stats.with_sample(st, vals, keys)

    return activation_states


#: The state keys ``sample.draw`` gives (``stats.with_sample``).
_SAMPLED = ("sample_keys", "sample_values", "min_abs")


def _row_shapes(sample_size: int, channels: int, positions: int) -> dict[str, list[int]]:
    """The shape of each state key in one ``BatchLayout`` row."""
    wide = {"channel_nnz": [channels], "spatial_nnz": [positions],
            "sample_keys": [sample_size], "sample_values": [sample_size]}
    return {k: wide.get(k, []) for k in stats.STATE_MERGE}
