"""Fuzz tests (hypothesis) of the statistics, the format parser and the read side.

- Statistics (numpy and TensorFlow, one-shot and accumulated over batches)
  of arbitrary tensors: any dtype the API accepts, any shape including empty,
  NaN, +-Inf, subnormals and values near the float limits. The counts are
  consistent (NaN + +Inf + -Inf + finite = size, each equal to numpy's own
  count) and every statistic stays in its range (percentiles ordered within
  [min, max], rates in [0, 1], ...). Unsupported dtypes raise the documented
  ``TypeError``.
- The format parser on arbitrary bytes and arbitrary PluginData messages:
  a result or the documented ``ValueError``, nothing else.
- The read side on arbitrary event-file bytes, on mutated (bit-flipped,
  cut, spliced) real event files and on arbitrary tensors: no exception, and
  whatever is served was written, value for value.
- The overview and findings on arbitrary series values: no exception, and
  the JSON is strict (no NaN leaks into it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from tb_introspect import metadata, slots, stats_np, summary_pb
from tb_introspect.plugin import http_io, overview
from tb_introspect.proto import plugin_data_pb2
from tb_introspect.read import provider
from tb_introspect.read.json_values import round_sig
from tb_introspect.read.series import Series, TagInfo
from tb_introspect.writer import NumpyWriter, tensor_stats_pb_from_array
from tests.reliability import reliability_testlib as rl

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                max_examples=150)
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture],
                max_examples=40)

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8,
          np.uint64, np.bool_]


@st.composite
def tensors(draw, max_dims: int = 4, max_side: int = 6):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side))
    if dtype.kind == "f":
        finfo = np.finfo(dtype)
        special = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, float(finfo.max),
                                   -float(finfo.max), float(finfo.tiny),
                                   float(finfo.smallest_subnormal), 1.0, -1.0])
        elements = st.one_of(special, st.floats(width=finfo.bits, allow_nan=True,
                                                allow_infinity=True))
        return draw(hnp.arrays(dtype, shape, elements=elements))
    return draw(hnp.arrays(dtype, shape))


def check_invariants(vec: np.ndarray, x: np.ndarray, view: str = "output",
                     sampled_min_abs: bool = False) -> None:
    """Counts exact and consistent; every statistic within its range."""
    fields = slots.tensor_stats_fields(view)
    assert vec.shape == (len(fields),)
    v = dict(zip(fields, vec.tolist(), strict=True))
    f = np.asarray(x).astype(np.float64).reshape(-1) if x.dtype != np.bool_ else \
        np.asarray(x, np.float64).reshape(-1)
    counts = ("finite_count", "nan_count", "posinf_count", "neginf_count")
    assert v["count"] == x.size
    assert v["finite_count"] + v["nan_count"] + v["posinf_count"] + v["neginf_count"] == x.size
    assert v["nan_count"] == np.isnan(f).sum()
    assert v["posinf_count"] == np.isposinf(f).sum()
    assert v["neginf_count"] == np.isneginf(f).sum()
    assert all(v[c] >= 0 and float(v[c]).is_integer() for c in counts)
    for rate in ("dead_rate", "spatial_dead_rate"):
        assert np.isnan(v[rate]) or 0.0 <= v[rate] <= 1.0, (rate, v[rate])
    if v["finite_count"] == 0:
        for name in ("mean", "min", "max", "rms", "q0", "q50", "q100", "zero_fraction"):
            assert np.isnan(v[name]), name
        return
    fin = f[np.isfinite(f)]
    assert v["min"] == fin.min() and v["max"] == fin.max()
    assert 0.0 <= v["zero_fraction"] <= 1.0 and 0.0 <= v["activation_rate"] <= 1.0
    assert v["zero_fraction"] + v["activation_rate"] == pytest.approx(1.0)
    if v["activation_rate"] == 0:
        assert np.isnan(v["sign_balance"])  # no non-zero value: no balance
    else:
        assert -1.0 <= v["sign_balance"] <= 1.0
    for name in ("rms", "l2", "std"):
        assert v[name] >= 0.0 and not np.isnan(v[name]), name
    span = max(abs(v["min"]), abs(v["max"]))
    assert v["min"] - 1e-9 * span <= v["mean"] <= v["max"] + 1e-9 * span
    q = np.array([v[slots.quantile_field(p)] for p in slots.DEFAULT_QUANTILES])
    assert q[0] == v["min"] and q[-1] == v["max"]
    assert (np.diff(q) >= 0).all(), q
    lq = np.array([v[slots.quantile_field(p, log=True)] for p in slots.DEFAULT_QUANTILES])
    if (fin != 0).any():
        assert (np.diff(lq) >= -1e-12).all(), lq
        smallest = np.log10(np.abs(fin[fin != 0]).min())
        if sampled_min_abs:  # an accumulator's sample may miss the smallest magnitude
            assert lq[0] >= smallest - 1e-12
        else:
            assert lq[0] == pytest.approx(smallest)
        assert lq[-1] == pytest.approx(np.log10(np.abs(fin).max()))


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """``x`` as TensorFlow's CPU kernels see it: subnormal float32/float64 values are zeros.

    TensorFlow runs its CPU kernels with flush-to-zero / denormals-are-zero,
    so the in-graph statistics count a subnormal (|x| < 1.2e-38 in float32)
    as a zero; the numpy twin keeps it. float16 inputs are cast to float32
    first, where all their values are normal.
    """
    if x.dtype in (np.float32, np.float64):
        return np.where(np.abs(x) < np.finfo(x.dtype).tiny, np.zeros_like(x), x)
    return x


# ---------------------------------------------------------------------------- statistics


@FAST
@given(x=tensors(), sample_size=st.one_of(st.none(), st.integers(1, 8)),
       seed=st.integers(0, 2**32 - 1))
def test_numpy_stats_counts_and_ranges(x, sample_size, seed):
    check_invariants(stats_np.tensor_stats(x, "output", sample_size=sample_size, seed=seed), x)


@FAST
@given(x=st.one_of(
    hnp.arrays(np.complex128, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0)),
    hnp.arrays(np.dtype("U3"), hnp.array_shapes(min_dims=0, max_dims=2, min_side=0)),
    st.lists(st.text(max_size=3), max_size=4).map(lambda v: np.array(v, dtype=object)),
))
def test_numpy_stats_refuse_other_dtypes_with_type_error(x):
    with pytest.raises(TypeError):
        stats_np.tensor_stats(x, "output")


@pytest.fixture(scope="module")
def tf_stats():
    tf = pytest.importorskip("tensorflow")
    from tb_introspect import stats

    return tf, stats


@SLOW
@given(x=tensors(max_dims=3, max_side=5))
def test_tensorflow_stats_counts_and_ranges(tf_stats, x):
    tf, stats = tf_stats
    # Flush-to-zero applies to arithmetic, not to copies: a min or max that selects a
    # subnormal element returns its bits (5e-324 stays 5e-324) while the counts see a zero,
    # so neither view of such an input is "the" expected one. The numpy twin covers them.
    assume(np.array_equal(flush_subnormals(x), x, equal_nan=True))
    check_invariants(stats.tensor_stats(tf.constant(x), "output").numpy(), flush_subnormals(x))


@SLOW
@given(batches=st.integers(1, 3).flatmap(lambda n: st.tuples(*[
    hnp.arrays(np.float32, st.tuples(st.integers(0, 4), st.just(3)),
               elements=st.one_of(st.floats(width=32), st.sampled_from(
                   [np.nan, np.inf, -np.inf, 0.0])))
    for _ in range(n)])))
def test_tensorflow_accumulated_counts_equal_the_concatenation(tf_stats, batches):
    tf, stats = tf_stats
    state = stats.empty_state(tf.TensorShape([None, 3]), sample_size=4)
    for b in batches:  # the training step's fold: a batch's state merged into the window's
        state = stats.merge_pair(state, stats.batch_state(tf.constant(b), 4))
    x = np.concatenate(batches)
    check_invariants(stats.finalize(state, "output").numpy(), flush_subnormals(x),
                     sampled_min_abs=True)


# ---------------------------------------------------------------------------- format parser


@FAST
@given(content=st.binary(max_size=300))
def test_parser_on_arbitrary_bytes_gives_data_or_value_error(content):
    try:
        data = metadata.parse_plugin_data(content)
    except ValueError:
        return
    assert isinstance(data, plugin_data_pb2.PluginData)
    try:
        info = provider.parse_tag_info("introspect/x", content)
    except ValueError:
        return
    assert info.fields and info.kind in (provider.KIND_TENSOR_STATS, provider.KIND_METRIC,
                                         provider.KIND_METRIC_EPOCH)


@st.composite
def plugin_data(draw):
    d = plugin_data_pb2.PluginData(
        version=draw(st.integers(-2**31, 2**31 - 1)),
        kind=draw(st.integers(-5, 10)),
        view=draw(st.one_of(st.sampled_from(slots.VIEWS), st.text(max_size=8))),
        layer=draw(st.text(max_size=8)),
        depth=draw(st.integers(-2**31, 2**31 - 1)),
        name=draw(st.text(max_size=8)),
        shape=draw(st.lists(st.integers(-2**63, 2**63 - 1), max_size=4)),
        dtype=draw(st.text(max_size=5)),
        cadence=draw(st.text(max_size=5)),
        fields=draw(st.lists(st.text(max_size=6), max_size=6)),
        quantiles=draw(st.lists(st.floats(), max_size=4)),
    )
    data = d.SerializeToString()
    cut = draw(st.integers(0, len(data)))  # sometimes a truncated message
    return data if draw(st.booleans()) else data[:cut]


@FAST
@given(content=plugin_data())
def test_parser_on_arbitrary_messages_gives_info_or_value_error(content):
    try:
        info = provider.parse_tag_info("introspect/x", content, max_step=3)
    except ValueError:
        return
    assert len(info.fields) > 0 and isinstance(info.depth, int)


# ---------------------------------------------------------------------------- event files


def _write_small_run(run_dir: Path, steps: int = 6) -> Path:
    with NumpyWriter(run_dir) as w:
        rng = np.random.default_rng(0)
        for step in range(1, steps + 1):
            s = tensor_stats_pb_from_array(
                rng.normal(size=(4, 3)), view="gradient", name="d/kernel", layer="d", epoch=0)
            s.value.extend(summary_pb.metric_pb("loss", 1.0 / step).value)
            w.add_summary(s, step)
        return Path(w.path)


GOOD_FILE = None


def _good_bytes() -> tuple[bytes, str]:
    global GOOD_FILE
    if GOOD_FILE is None:
        with tempfile.TemporaryDirectory(prefix="fuzz-good-") as tmp:
            path = _write_small_run(Path(tmp))
            GOOD_FILE = (path.read_bytes(), path.name)
    return GOOD_FILE


def _read_dir_bytes(data: bytes, name: str = "events.out.tfevents.1.fuzz") -> dict:
    """Read ``data`` as the one event file of run ``r`` with the read side (``read.provider``)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        os.makedirs(os.path.join(tmp, "r"))
        Path(tmp, "r", name).write_bytes(data)
        return provider.read_logdir(tmp)


def _assert_served_were_written(runs: dict, data: bytes) -> None:
    written = rl.points_in_bytes(data) if data else {}
    for rs in runs.values():
        for tag, s in rs.all_series().items():
            for i, step in enumerate(s.steps.tolist()):
                want = written[tag][step]
                np.testing.assert_array_equal(s.values[i], want.astype(np.float64))


@SLOW
@given(data=st.binary(max_size=2000))
def test_reader_on_arbitrary_bytes(data):
    runs = _read_dir_bytes(data)
    assert all(not rs.all_series() for rs in runs.values())


@st.composite
def mutated_event_files(draw):
    good, _ = _good_bytes()
    data = bytearray(good)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "splice"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=40))
        else:  # a copy of another part of the file, as a misdirected write leaves
            a = draw(st.integers(0, len(good)))
            data[pos:pos] = good[a:a + draw(st.integers(1, 200))]
    return bytes(data)


@SLOW
@given(data=mutated_event_files())
def test_reader_on_mutated_event_files_serves_only_what_was_written(data):
    runs = _read_dir_bytes(data)
    good, _ = _good_bytes()
    # Anything served is an intact record of the original file, with its values.
    _assert_served_were_written(runs, good)


@SLOW
@given(values=st.lists(st.one_of(
    hnp.arrays(st.sampled_from([np.float64, np.float32, np.int64, np.bool_]),
               hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=40)),
    st.lists(st.binary(max_size=3), min_size=1, max_size=35).map(
        lambda v: np.array(v, dtype=object)),
    st.just(np.zeros(len(slots.tensor_stats_fields("output")))),
), min_size=1, max_size=4))
def test_reader_on_arbitrary_tensors_serves_exactly_the_well_formed_tags(values):
    width = len(slots.tensor_stats_fields("output"))
    meta = metadata.create_tensor_stats_metadata(view="output", name="t")
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        with NumpyWriter(os.path.join(tmp, "r")) as w:
            for step, v in enumerate(values, start=1):
                s = summary_pb2.Summary()
                s.value.add(tag="introspect/output/t", metadata=meta,
                            tensor=tensor_util.make_tensor_proto(v))
                w.add_summary(s, step)
        runs = provider.read_logdir(tmp)
    rs = runs["r"]
    readable = all(v.size == width and v.dtype != object for v in values)
    series = rs.all_series().get("introspect/output/t")
    if readable:
        assert series is not None and len(series) == len(values)
        for i, v in enumerate(values):
            np.testing.assert_array_equal(series.values[i], v.reshape(-1).astype(np.float64))
    elif all(v.size == width for v in values):
        # Right length but not numbers (strings): served only if they convert.
        assert series is None or len(series) == len(values)
    else:
        assert series is None and [t for t, _ in rs.skipped] == ["introspect/output/t"]


# ---------------------------------------------------------------------------- overview, findings


@st.composite
def run_series(draw):
    """A RunSeries with arbitrary values in every field (as a corrupt writer could log)."""
    value = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([0.0, 1.0, -1.0, 1e308, 5e-324]))
    steps = np.array(sorted(draw(st.sets(st.integers(0, 10**6), min_size=1, max_size=6))))
    infos, series = {}, {}
    for view in draw(st.sets(st.sampled_from(slots.VIEWS), max_size=4)):
        for k in range(draw(st.integers(1, 3))):
            fields = slots.tensor_stats_fields(view)
            tag = metadata.stats_tag(view, f"t{k}")
            n = draw(st.integers(1, len(steps)))
            info = TagInfo(tag=tag, kind=provider.KIND_TENSOR_STATS, version=1,
                                  name=f"t{k}", fields=fields, view=view, layer=f"l{k}",
                                  depth=k, quantiles=slots.DEFAULT_QUANTILES)
            vals = np.array(draw(st.lists(st.lists(value, min_size=len(fields),
                                                   max_size=len(fields)),
                                          min_size=n, max_size=n)))
            infos[tag] = info
            series[tag] = Series(info, steps[:n], np.zeros(n), vals)
    for kind, fields, make_tag in ((provider.KIND_METRIC, slots.METRIC_FIELDS, False),
                                   (provider.KIND_METRIC_EPOCH, slots.METRIC_EPOCH_FIELDS,
                                    True)):
        if draw(st.booleans()):
            tag = metadata.metric_tag("loss", per_epoch=make_tag)
            n = len(steps)
            vals = np.array(draw(st.lists(st.lists(value, min_size=len(fields),
                                                   max_size=len(fields)),
                                          min_size=n, max_size=n)))
            infos[tag] = TagInfo(tag=tag, kind=kind, version=1, name="loss",
                                        fields=fields)
            series[tag] = Series(infos[tag], steps, np.zeros(n), vals)
    return provider.assemble_run("r", infos, series)


@settings(SLOW, phases=(Phase.explicit, Phase.reuse, Phase.generate))  # shrinking: minutes
@given(rs=run_series())
def test_overview_and_findings_on_arbitrary_values(rs):
    with np.errstate(all="ignore"):
        doc = overview.compute_overview(rs)
    http_io.encode(doc)  # strict JSON: raises on any NaN or Inf left in
    assert "findings_error" not in doc, doc.get("findings_error")


@FAST
@given(x=st.floats(allow_nan=False, allow_infinity=False))
@example(x=np.finfo(np.float64).max).via("the float maximum, whose rounding overflowed")
def test_rounding_keeps_every_finite_float(x):
    """The findings' JSON rounds to 4 significant digits: up to the float maximum, where
    rounding up would overflow (1.798e308 is out of range), the value stays finite and near."""
    r = round_sig(x, 4)
    assert np.isfinite(r) and abs(r - x) <= 5e-4 * abs(x), (x, r)
