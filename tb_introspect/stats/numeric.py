"""Input checks, seeds and the float64 arithmetic every part of the engine shares."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

#: Default bound on the number of sampled values percentiles are taken from.
DEFAULT_SAMPLE_SIZE = 2**18

F64 = tf.float64
NAN = float("nan")
INF = float("inf")
# Moments are taken of x * 2**-e with e the binary exponent of max|x|, clipped so
# that the scale factor itself is a normal float64; this keeps squares of values
# near the float64 limits from overflowing.
MAX_EXP = 1000.0

# The code has no Python control flow on tensors; skipping AutoGraph's source
# conversion makes tracing inside tf.function several times faster.
no_autograph = tf.autograph.experimental.do_not_convert


def describe(x, name: str | None) -> str:
    if name:
        return name
    try:
        return x.name
    except (AttributeError, ValueError):  # eager tensors have no name
        return f"<tensor of shape {getattr(x, 'shape', '?')}>"


def to_float(x, name: str | None = None) -> tf.Tensor:
    """``x`` as float32 (float16/bfloat16/float32/small ints/bool) or float64."""
    try:
        t = tf.convert_to_tensor(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cannot compute statistics of {describe(x, name)!r}: {e}") from e
    dt = t.dtype
    if not (dt.is_floating or dt.is_integer or dt.is_bool) or dt.is_complex or dt.is_quantized:
        raise TypeError(
            f"cannot compute statistics of tensor {describe(x, name)!r} with dtype"
            f" {dt.name}: expected a float, integer or bool tensor"
        )
    if dt == tf.float32:
        return t
    if dt in (tf.float64, tf.int32, tf.int64, tf.uint32, tf.uint64):
        return tf.cast(t, F64)  # float32 would round integers above 2**24
    return tf.cast(t, tf.float32)


def check_quantiles(quantiles: Sequence[float]) -> np.ndarray:
    q = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if q.size == 0 or not np.all((q >= 0) & (q <= 100)):
        raise ValueError(f"quantiles must be percentile points in [0, 100], got {quantiles!r}")
    return q


def check_sample_size(sample_size: int) -> int:
    k = int(sample_size)
    if k < 1:
        raise ValueError(f"sample_size must be a positive integer, got {sample_size!r}")
    return k


def seed_pair(seed) -> tf.Tensor:
    s = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    if s.shape.rank == 0:
        s = tf.stack([s, tf.constant(0x5EED, tf.int64)])
    return s


def uniform(shape, seed, salt: int) -> tf.Tensor:
    """Uniform [0, 1) float64 from a stateless seed (shape-[2] int64) plus ``salt``."""
    return tf.random.stateless_uniform(shape, seed=seed + [salt, 0], dtype=F64)


def normal(shape, seed, salt: int) -> tf.Tensor:
    return tf.random.stateless_normal(shape, seed=seed + [salt, 0], dtype=F64)


def content_seed(*values: tf.Tensor) -> tf.Tensor:
    """A stateless seed made from the bits of float64 scalars (e.g. the tensor's moments).

    Without a user seed the sample is then a deterministic function of the data:
    equal tensors give equal statistics, and nothing depends on op-level RNG
    state (XLA ignores the seeds of stateful random ops).
    """
    bits = [tf.bitcast(tf.cast(v, F64), tf.int64) for v in values]
    mixed = bits[0]
    for b in bits[1:]:
        mixed = tf.bitwise.bitwise_xor(mixed * 1000003, b)
    return tf.stack([mixed, bits[-1]])


def where(cond, a, b) -> tf.Tensor:
    """``tf.where`` that gives Python numbers the dtype of the tensor argument (float64 if none)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        a = tf.constant(a, F64)
    if isinstance(a, (int, float)):
        a = tf.constant(a, tf.convert_to_tensor(b).dtype)
    elif isinstance(b, (int, float)):
        b = tf.constant(b, tf.convert_to_tensor(a).dtype)
    return tf.where(cond, a, b)


def count(mask) -> tf.Tensor:
    """Number of True elements, as float64 (int32 sums are the cheapest exact count)."""
    size = mask.shape.num_elements()
    if size is not None and size < 2**31:
        return tf.cast(tf.reduce_sum(tf.cast(mask, tf.int32)), F64)
    return tf.cast(tf.math.count_nonzero(mask, dtype=tf.int64), F64)


def pow2(e) -> tf.Tensor:
    return tf.pow(tf.constant(2.0, F64), e)


def scale_exponent(vmin, vmax) -> tf.Tensor:
    """Binary exponent of max(|vmin|, |vmax|), 0 when that is not a positive finite number."""
    m = tf.maximum(tf.abs(vmin), tf.abs(vmax))
    ok = tf.math.is_finite(m) & (m > 0)
    e = tf.floor(tf.math.log(where(ok, m, 1.0)) / np.log(2.0))
    return tf.clip_by_value(where(ok, e, 0.0), -MAX_EXP, MAX_EXP)


def sum_of_squares(x: tf.Tensor, axis: int | None = None) -> tf.Tensor:
    """sum(x*x) as float64: TensorFlow's fused norm kernel (no squared copy), or XLA's fusion."""
    if in_xla_context():  # XLA has no EuclideanNorm; it fuses the square into the sum
        return tf.cast(tf.reduce_sum(tf.square(x), axis=axis), F64)
    return tf.square(tf.cast(tf.math.reduce_euclidean_norm(x, axis=axis), F64))


def log10(v):
    return tf.math.log(v) / np.log(10.0)


def in_xla_context() -> bool:
    """Whether the op being built will be compiled by XLA (``jit_compile=True``)."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # moved: take the path that compiles everywhere
        return True
    return control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())
