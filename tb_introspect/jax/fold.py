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


#: Below this many elements a float32 sum of 0/1 or -1/0/1 values is an exact integer: XLA's
#: CPU reductions of floats are vectorized, several times faster than of booleans or ints.
_EXACT_F32 = 2**24


def _total(v: jax.Array, n: int) -> jax.Array:
    """The sum of ``v`` (0/1 or -1/0/1 values of ``n`` elements) as an exact int32."""
    if n < _EXACT_F32:
        return jnp.sum(v.astype(jnp.float32)).astype(jnp.int32)
    return jnp.sum(v.astype(jnp.int32))


def _columns(active: jax.Array, seg: Segment) -> jax.Array:
    """The non-zero counts (int32) of every channel (the last axis), then of every position
    (axes 1 to -2), from the 0/1 float32 array ``active`` (batch first): the batch summed
    first, by a vector-matrix product with ones (exact below 2**24 rows, and XLA's fastest
    reduction on a CPU), the rest on the small column array."""
    rank = active.ndim
    if rank <= 1:
        return _total(active, active.size).reshape(1)
    batch = active.shape[0]
    if batch < _EXACT_F32:
        cols = (jnp.ones(batch, active.dtype) @ active.reshape(batch, -1)).astype(jnp.int32)
    else:
        cols = jnp.sum(active.astype(jnp.int32), axis=0)
    if rank == 2:
        return cols
    cols = cols.reshape(-1, active.shape[-1])  # (positions, channels)
    return jnp.concatenate([cols.sum(0), cols.sum(1)])


def _floats(x: jax.Array) -> jax.Array:
    dt = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    return x.astype(dt)


def _static(n: int, dt: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """A static element count as two exact floats of ``dt``."""
    return jnp.asarray([float(n - n % _SPLIT)], dt), jnp.asarray([float(n % _SPLIT)], dt)


def _active(xf: jax.Array) -> jax.Array:
    """1.0 where ``xf`` holds a finite non-zero value, else 0.0 (float32)."""
    return jnp.where(jnp.isfinite(xf), jnp.abs(jnp.sign(xf)), 0).astype(jnp.float32)


def count(st: State, x: jax.Array, seg: Segment) -> State:
    """Add only ``x``'s activity counts (a lean step: ``act_count`` and the per-channel
    and per-position counts of finite non-zero values)."""
    xf = _floats(x)
    dt = st["hi"].dtype
    cols_big, cols_small = _split(_columns(_active(xf), seg), dt)
    n_big, n_small = _static(x.size, dt)
    zeros = jnp.zeros(ADDITIVE_LEN - 1, dt)
    return _add(st, jnp.concatenate([zeros, n_big, cols_big]),
                jnp.concatenate([zeros, n_small, cols_small]))


def _parts(flat: jax.Array, finite: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One step's counts (NaN, +Inf, -Inf, positive, negative; int32), sums (sum, two-pass
    m2, count * mean**2) and extremes (min, -max) of the finite values of ``flat``.
    ``finite``: valid only where every value is finite (no pass masks them)."""
    n = flat.size
    if finite:
        xz, infs, inf_bal, nan = flat, 0, 0, 0
    else:
        ok = jnp.isfinite(flat)
        xz = jnp.where(ok, flat, 0)
        # flat - xz: 0 where finite, NaN or +-Inf where not
        kinds = flat - xz
        inf = jnp.nan_to_num(kinds, nan=0.0, posinf=1.0, neginf=-1.0)
        inf_bal, infs = _total(inf, n), _total(jnp.abs(inf), n)
        nan = _total(jnp.isnan(kinds), n)
    sign = jnp.sign(xz)
    bal, nnz = _total(sign, n), _total(jnp.abs(sign), n)
    ints = jnp.stack([jnp.asarray(v, jnp.int32) for v in (
        nan, (infs + inf_bal) // 2, (infs - inf_bal) // 2, (nnz + bal) // 2, (nnz - bal) // 2)])
    nfin = n - nan - infs
    total = jnp.sum(xz)
    mean = total / jnp.maximum(nfin, 1).astype(xz.dtype)
    dev = xz - mean if finite else jnp.where(ok, xz - mean, 0)
    sums = jnp.stack([total, jnp.sum(dev * dev), jnp.asarray(nfin, xz.dtype) * mean * mean])
    if finite:
        lo, hi = jnp.min(flat), jnp.max(flat)
    else:
        lo = jnp.min(jnp.where(ok, flat, jnp.inf))
        hi = jnp.max(jnp.where(ok, flat, -jnp.inf))
    return ints, sums, jnp.stack([lo, -hi])


def fold(st: State, x: jax.Array, seg: Segment, key: jax.Array) -> State:
    """Add every part of ``x`` (a statistics step): ``fold_many`` of one array."""
    return fold_many([st], [x], [seg], [key])[0]


def fold_many(states: list[State], xs: list[jax.Array], segs: list[Segment],
              keys: list[jax.Array]) -> list[State]:
    """Add every part of each array of ``xs`` to its state (a statistics step): counts by
    kind, sign counts, the sum, the two-pass ``m2``, the count times the mean squared, the
    activity counts, the extremes of the finite values and ``k`` draws into the
    bottom-``k`` sample (``keys``: ``jax.random`` keys, each array's own for this step).

    The scalar parts are taken assuming every value is finite (a few passes XLA fuses
    well), and again with the masking passes only where one of the sums says otherwise: one
    ``lax.cond`` for all the arrays (a NaN or an Inf is rare; XLA's CPU code for many masked
    reductions at once is several times slower, and each conditional costs milliseconds)."""
    flats = [_floats(x).reshape(-1) for x in xs]
    live = [i for i, f in enumerate(flats) if f.size]  # an empty one adds nothing
    if not live:
        return list(states)
    dt = [st["hi"].dtype for st in states]
    # What reads the arrays beside the scalar parts comes first, so that the conditional
    # below is their last use (XLA copies a conditional's operands that live on).
    cols = {i: _split(_columns(_active(_floats(xs[i])), segs[i]), dt[i]) for i in live}
    draws = {i: _draws(flats[i], segs[i].k, keys[i], dt[i]) for i in live}
    # the barrier keeps XLA from moving the fast parts into the branch (code motion)
    fast = jax.lax.optimization_barrier([_parts(flats[i], True) for i in live])
    finite = jnp.all(jnp.isfinite(jnp.stack([p[1][0] for p in fast])))
    parts = dict(zip(live, jax.lax.cond(
        finite, lambda fs: fast, lambda fs: [_parts(f, False) for f in fs],
        [flats[i] for i in live]), strict=True))
    out = list(states)
    for i in live:
        st, (ints, sums, ext), (c_big, c_small) = states[i], parts[i], cols[i]
        k_big, k_small = _split(ints, dt[i])
        n_big, n_small = _static(flats[i].size, dt[i])  # count, and act_count: every element
        st = _add(st, jnp.concatenate([n_big, k_big, sums.astype(dt[i]), n_big, c_big]),
                  jnp.concatenate([n_small, k_small, jnp.zeros(3, dt[i]), n_small, c_small]))
        both_k = jnp.concatenate([st["keys"], draws[i][0]])
        both_v = jnp.concatenate([st["vals"], draws[i][1]])
        _, keep = jax.lax.top_k(-both_k, segs[i].k)
        out[i] = {**st, "ext": jnp.minimum(st["ext"], ext.astype(dt[i])),
                  "keys": both_k[keep], "vals": both_v[keep]}
    return out


def _draws(flat: jax.Array, k: int, key: jax.Array, dt: jnp.dtype
           ) -> tuple[jax.Array, jax.Array]:
    """``k`` sample entries of ``flat`` (non-finite values zeroed: placeholders the host
    skips, ``_flushed``): every element with its own uniform key when ``flat`` has at most ``k``
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
    """``v`` with non-finite and subnormal values zeroed (placeholders the host skips):
    XLA's CPU kernels treat subnormals as zeros (the counts above did), and a copied value
    keeps its bits."""
    keep = jnp.isfinite(v) & (jnp.abs(v) >= jnp.finfo(v.dtype).tiny)
    return jnp.where(keep, v, jnp.zeros_like(v))


def to_segment(st: dict[str, np.ndarray], seg: Segment) -> np.ndarray:
    """The float64 segment (``stats_np.segments``' layout) of a state copied to the host."""
    hi, lo = np.asarray(st["hi"], np.float64), np.asarray(st["lo"], np.float64)
    # an infinite sum leaves NaN in its error term (inf - inf)
    additive = np.where(np.isfinite(hi), hi + lo, hi)
    return np.concatenate([additive, np.asarray(st["ext"], np.float64),
                           np.asarray(st["keys"], np.float64),
                           np.asarray(st["vals"], np.float64)])
