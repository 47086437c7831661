"""The folds of a jitted step: a layer output or output gradient into its segment's state
on the device, pure functions of arrays (``jit``, ``vmap``-free, sharding-agnostic).

A tensor's state holds the segment of ``stats_np.segments`` (the PyTorch front-end's
layout) as arrays: the additive part (counts, sums, per-channel and per-position non-zero
counts) as a pair ``hi + lo``, the two extremes, and the bottom-``k`` sample's keys and
values. Without ``jax_enable_x64`` JAX has no float64, so the additive part is summed in
float32 pairs (error-free ``two_sum``: about 48 bits, counts exact to 2**48 where one
float32 would stop at 2**24); with x64 both are float64. Within a step the sums are
float32 (float64 for float64 arrays) and the second moment is two-pass, as PyTorch's fold.

Under ``jit`` over sharded arrays XLA computes each reduction over the whole (logical)
array, so the state is the unsharded array's: counts and extremes exactly, sums up to the
order of additions, and the same sample positions (the draws depend on the key and the
element count only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tb_introspect.stats_np.segments import ADDITIVE_LEN, EXTREMES_LEN, Segment

State = dict[str, jax.Array]

#: Integer counts are split at this power of two before they become floats: both halves
#: are then exact in float32 (a count below 2**31 has at most 15 bits above it).
_SPLIT = 2**16


def acc_dtype() -> jnp.dtype:
    """The states' float type: float64 where JAX has it (``jax_enable_x64``), else float32."""
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def empty(seg: Segment) -> State:
    """A state holding nothing (the segment's ``empty``)."""
    dt = acc_dtype()
    n = ADDITIVE_LEN + seg.channels + seg.positions
    return {"hi": jnp.zeros(n, dt), "lo": jnp.zeros(n, dt),
            "ext": jnp.full(EXTREMES_LEN, jnp.inf, dt),
            "keys": jnp.full(seg.k, jnp.inf, dt), "vals": jnp.zeros(seg.k, dt)}


def _two_sum(hi: jax.Array, lo: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``hi + lo + x`` as a new pair, the rounding error of ``hi + x`` kept in ``lo``
    (Knuth's two-sum: exact in any IEEE float type)."""
    s = hi + x
    b = s - hi
    return s, lo + ((hi - (s - b)) + (x - b))


def _add(st: State, big: jax.Array, small: jax.Array) -> State:
    hi, lo = _two_sum(st["hi"], st["lo"], big)
    hi, lo = _two_sum(hi, lo, small)
    return {**st, "hi": hi, "lo": lo}


def _split(counts: jax.Array, dt: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """Integer ``counts`` as two floats of ``dt`` whose sum is exact."""
    low = counts % _SPLIT
    return (counts - low).astype(dt), low.astype(dt)


def _columns(active: jax.Array, seg: Segment) -> jax.Array:
    """The non-zero counts (int32) of every channel (the last axis), then of every position
    (axes 1 to -2), from the 0/1 array ``active`` (batch first)."""
    rank = active.ndim
    if rank <= 1:
        return jnp.sum(active, dtype=jnp.int32).reshape(1)
    if rank == 2:
        return jnp.sum(active, axis=0, dtype=jnp.int32)
    channel = jnp.sum(active, axis=tuple(range(rank - 1)), dtype=jnp.int32)
    position = jnp.sum(active, axis=(0, rank - 1), dtype=jnp.int32).reshape(-1)
    return jnp.concatenate([channel, position])


def _floats(x: jax.Array) -> jax.Array:
    dt = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    return x.astype(dt)


def _static(n: int, dt: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """A static element count as two exact floats of ``dt``."""
    return jnp.asarray([float(n - n % _SPLIT)], dt), jnp.asarray([float(n % _SPLIT)], dt)


def count(st: State, x: jax.Array, seg: Segment) -> State:
    """Add only ``x``'s activity counts (a lean step: ``act_count`` and the per-channel
    and per-position counts of finite non-zero values)."""
    xf = _floats(x)
    dt = st["hi"].dtype
    cols_big, cols_small = _split(_columns(jnp.isfinite(xf) & (xf != 0), seg), dt)
    n_big, n_small = _static(x.size, dt)
    zeros = jnp.zeros(ADDITIVE_LEN - 1, dt)
    return _add(st, jnp.concatenate([zeros, n_big, cols_big]),
                jnp.concatenate([zeros, n_small, cols_small]))


def fold(st: State, x: jax.Array, seg: Segment, key: jax.Array) -> State:
    """Add every part of ``x`` (a statistics step): counts by kind, sign counts, the sum,
    the two-pass ``m2``, the count times the mean squared, the activity counts, the
    extremes of the finite values and ``k`` draws into the bottom-``k`` sample (``key``:
    a ``jax.random`` key, this tensor's own for this step)."""
    xf = _floats(x)
    flat = xf.reshape(-1)
    n = flat.size
    if n == 0:
        return st
    dt = st["hi"].dtype
    finite = jnp.isfinite(flat)
    xz = jnp.where(finite, flat, 0)
    ints = jnp.int32
    kinds = jnp.stack([jnp.sum(jnp.isnan(flat), dtype=ints),
                       jnp.sum(flat == jnp.inf, dtype=ints),
                       jnp.sum(flat == -jnp.inf, dtype=ints),
                       jnp.sum(xz > 0, dtype=ints), jnp.sum(xz < 0, dtype=ints)])
    nfin = (n - kinds[0] - kinds[1] - kinds[2]).astype(xz.dtype)
    total = jnp.sum(xz)
    mean = total / jnp.maximum(nfin, 1)
    dev = jnp.where(finite, xz - mean, 0)
    sums = jnp.stack([total, jnp.sum(dev * dev), nfin * mean * mean]).astype(dt)
    k_big, k_small = _split(kinds, dt)
    c_big, c_small = _split(_columns((xz != 0).reshape(xf.shape), seg), dt)
    n_big, n_small = _static(n, dt)  # count, and act_count: every element
    st = _add(st, jnp.concatenate([n_big, k_big, sums, n_big, c_big]),
              jnp.concatenate([n_small, k_small, jnp.zeros(3, dt), n_small, c_small]))
    lo = jnp.min(jnp.where(finite, flat, jnp.inf))
    hi = jnp.max(jnp.where(finite, flat, -jnp.inf))
    ext = jnp.minimum(st["ext"], jnp.stack([lo, -hi]).astype(dt))
    keys, vals = _draws(xz, seg.k, key, dt)
    both_k = jnp.concatenate([st["keys"], keys])
    both_v = jnp.concatenate([st["vals"], vals])
    _, keep = jax.lax.top_k(-both_k, seg.k)
    return {**st, "ext": ext, "keys": both_k[keep], "vals": both_v[keep]}


def _draws(flat: jax.Array, k: int, key: jax.Array, dt: jnp.dtype
           ) -> tuple[jax.Array, jax.Array]:
    """``k`` sample entries of ``flat`` (non-finite values zeroed: placeholders the host
    skips): every element with its own uniform key when ``flat`` has at most ``k``
    (infinite keys pad the rest), else ``k`` uniform positions carrying the ``k`` smallest
    of ``n`` uniform keys (exponential spacings), as ``torch/state.py`` draws them."""
    n = flat.size
    k_key, k_pos = jax.random.split(key)
    if n <= k:
        keys = jnp.full(k, jnp.inf, dt).at[:n].set(jax.random.uniform(k_key, (n,), dt))
        vals = jnp.zeros(k, dt).at[:n].set(_flushed(flat.astype(dt)))
        return keys, vals
    keys = jnp.cumsum(jax.random.exponential(k_key, (k,), dt)) / (n + 1)
    pos = jnp.minimum((jax.random.uniform(k_pos, (k,)) * n).astype(jnp.int32), n - 1)
    return keys, _flushed(flat[pos].astype(dt))


def _flushed(v: jax.Array) -> jax.Array:
    """``v`` with subnormal values zeroed: XLA's CPU kernels treat them as zeros (the
    counts above did), and a copied value keeps its bits."""
    return jnp.where(jnp.abs(v) < jnp.finfo(v.dtype).tiny, jnp.zeros_like(v), v)


def to_segment(st: dict[str, np.ndarray], seg: Segment) -> np.ndarray:
    """The float64 segment (``stats_np.segments``' layout) of a state copied to the host."""
    hi, lo = np.asarray(st["hi"], np.float64), np.asarray(st["lo"], np.float64)
    # an infinite sum leaves NaN in its error term (inf - inf)
    additive = np.where(np.isfinite(hi), hi + lo, hi)
    return np.concatenate([additive, np.asarray(st["ext"], np.float64),
                           np.asarray(st["keys"], np.float64),
                           np.asarray(st["vals"], np.float64)])
