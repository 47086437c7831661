"""tf.summary-style ops writing tb-introspect summaries under the default writer.

``tensor_stats_summary`` computes a tensor's statistics in the graph (``tb_introspect.stats``)
and writes them; ``write_stats_vector`` writes a vector computed elsewhere; ``metric_summary``
and ``metric_epoch_summary`` write a loss or metric. Use them eagerly or in a ``tf.function``
training step:

>>> import tempfile
>>> kernel = tf.Variable(tf.random.normal([8, 4], seed=1))
>>> @tf.function
... def train_step(step):
...     with tf.GradientTape() as tape:
...         loss = tf.reduce_mean(kernel ** 2)
...     grad = tape.gradient(loss, kernel)
...     kernel.assign_sub(0.1 * grad)
...     tensor_stats_summary("dense/kernel", kernel, step, view="variable", layer="dense")
...     tensor_stats_summary("dense/kernel", grad, step, view="gradient", layer="dense")
...     return metric_summary("loss", loss, step)
>>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
...     bool(train_step(tf.constant(0, tf.int64)))
True

Each op returns the boolean tensor of ``tf.summary.write`` (False when no
default writer is set). ``tf.summary`` ops fail inside XLA-compiled functions:
compute ``stats.tensor_stats`` in the compiled step and write the vector outside
with ``write_stats_vector``. The numpy twins are in ``tb_introspect.summary_pb``
and ``tb_introspect.writer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from tb_introspect import metadata, slots, stats, summary_pb


def _fill(vector: tf.Tensor, fields: Sequence[str], values: Mapping[str, object]) -> tf.Tensor:
    """``vector`` with the named slots replaced (values may be tensors)."""
    if not values:
        return vector
    for key in values:
        if key not in fields:
            raise ValueError(f"{key!r} is not a slot of this layout; slots: {tuple(fields)}")
    parts = tf.unstack(vector, num=len(fields))
    for key, value in values.items():
        value = tf.convert_to_tensor(value, dtype_hint=tf.float64)
        parts[fields.index(key)] = tf.cast(tf.reshape(value, []), tf.float64)
    return tf.stack(parts)


def write_stats_vector(
    name: str,
    vector,
    step=None,
    *,
    view: str,
    layer: str = "",
    depth: int = 0,
    shape: Sequence[int | None] = (),
    dtype: str = "float32",
    cadence: str = "step",
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
) -> tf.Tensor:
    """Write an already computed statistics vector (e.g. from ``stats.tensor_stats``).

    ``step`` defaults to ``tf.summary.experimental.get_step()``; ``shape`` and ``dtype``
    describe the tensor the vector is of.

    >>> import tempfile
    >>> vector = stats.tensor_stats(tf.range(6.0), "output")  # e.g. in an XLA-compiled step
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     bool(write_stats_vector("dense/output", vector, 3, view="output", shape=(6,)))
    True
    """
    meta = metadata.create_tensor_stats_metadata(
        view=view, name=name, layer=layer, depth=depth, shape=shape, dtype=dtype,
        cadence=cadence, quantiles=quantiles,
    )
    n = len(slots.tensor_stats_fields(view, quantiles))
    vec = tf.cast(tf.reshape(vector, [-1]), tf.float64)
    if vec.shape[0] is not None and vec.shape[0] != n:
        raise ValueError(f"{name}: statistics vector has {vec.shape[0]} slots, layout has {n}")
    return tf.summary.write(
        tag=metadata.stats_tag(view, name), tensor=vec, step=step, metadata=meta
    )


def tensor_stats_summary(
    name: str,
    tensor,
    step=None,
    *,
    view: str,
    layer: str = "",
    depth: int = 0,
    cadence: str = "step",
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    epoch=0,
    sample_size: int = stats.DEFAULT_SAMPLE_SIZE,
    seed=None,
    extras: Mapping[str, object] | None = None,
) -> tf.Tensor:
    """Compute the statistics of ``tensor`` in-graph and write them.

    ``epoch`` fills the ``epoch`` slot; ``extras`` sets view slots such as ``update_ratio``
    / ``cos_prev`` by name. ``sample_size`` and ``seed`` are ``stats.tensor_stats``'.

    >>> import tempfile
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     bool(tensor_stats_summary("dense/kernel", tf.ones([4, 3]), 0, view="variable"))
    True
    >>> bool(tensor_stats_summary("dense/kernel", tf.ones([4, 3]), 0, view="variable"))
    False
    """
    t = tf.convert_to_tensor(tensor) if not isinstance(tensor, tf.Variable) else tensor
    vec = stats.tensor_stats(
        t, view, quantiles=quantiles, sample_size=sample_size, seed=seed, name=name
    )
    fields = slots.tensor_stats_fields(view, quantiles)
    vec = _fill(vec, fields, {"epoch": epoch, **(extras or {})})
    return write_stats_vector(
        name, vec, step, view=view, layer=layer, depth=depth,
        shape=t.shape.as_list() if t.shape.rank is not None else (),
        dtype=t.dtype.name, cadence=cadence, quantiles=quantiles,
    )


def metric_summary(name: str, value, step=None, *, epoch=0) -> tf.Tensor:
    """Write one per-step value of a loss or metric.

    >>> import tempfile
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     bool(metric_summary("loss", 0.25, 10, epoch=1))
    True
    """
    value = tf.convert_to_tensor(value, dtype_hint=tf.float64)  # Python floats stay float64
    vec = tf.stack([tf.cast(epoch, tf.float64), tf.cast(tf.reshape(value, []), tf.float64)])
    return tf.summary.write(
        tag=metadata.metric_tag(name), tensor=vec, step=step,
        metadata=metadata.create_metric_metadata(name),
    )


def metric_epoch_band(values, epoch=0) -> tf.Tensor:
    """``[epoch, min, p25, p50, p75, max, mean, count]`` over the finite ``values``.

    ``summary_pb.metric_epoch_band`` run as a numpy function (eagerly or in a ``tf.function``,
    not under XLA, where ``tf.summary`` cannot run either).

    >>> metric_epoch_band([1.0, 2.0, float("nan"), 3.0], epoch=2).numpy().tolist()
    [2.0, 1.0, 1.5, 2.0, 2.5, 3.0, 2.0, 3.0]
    """
    v = tf.convert_to_tensor(values, dtype_hint=tf.float64)  # Python floats stay float64
    v = tf.cast(tf.reshape(v, [-1]), tf.float64)
    band = tf.numpy_function(
        summary_pb.metric_epoch_band, [v, tf.cast(epoch, tf.float64)], tf.float64, stateful=False
    )
    return tf.ensure_shape(band, [len(slots.METRIC_EPOCH_FIELDS)])


def metric_epoch_summary(name: str, values, step=None, *, epoch=0) -> tf.Tensor:
    """Write the per-epoch band of a metric's per-step ``values`` (see ``metric_epoch_band``).

    >>> import tempfile
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     bool(metric_epoch_summary("loss", [0.5, 0.25, 0.75], 10, epoch=1))
    True
    """
    return tf.summary.write(
        tag=metadata.metric_tag(name, per_epoch=True),
        tensor=metric_epoch_band(values, epoch),
        step=step,
        metadata=metadata.create_metric_metadata(name, per_epoch=True),
    )
