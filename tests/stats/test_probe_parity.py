"""The producers of the transformer probes agree on the one contract
(``pipeline/probe_window.py``, docs/format.md "Version 4: probes").

Three producers: the numpy reference (``probe_window``, the hub), the Keras front-end's
in-graph numbers and device state (``keras/probes.py``) and PyTorch's (``torch/probes.py``,
``torch/probe_values.py``). First the contract's own reduction (``combine``, ``fold``) and
definitions; then each number of each front-end against the reference on the same values,
the edge cases included (an even count, NaN, ±inf, a long sequence); then one statistics
step of the same small transformer in each front-end, written to event files and read back
as the plugin reads them, row by row.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from tb_introspect import slots, summary_pb  # noqa: E402
from tb_introspect.keras import Introspect  # noqa: E402
from tb_introspect.keras import probe_values as keras_values  # noqa: E402
from tb_introspect.keras import probes as keras_probes  # noqa: E402
from tb_introspect.pipeline import probe_window as pw  # noqa: E402
from tb_introspect.read import provider  # noqa: E402
from tb_introspect.read.series import probes_of  # noqa: E402
from tb_introspect.torch import Introspector  # noqa: E402
from tb_introspect.torch import probe_values as torch_values  # noqa: E402

NAN, INF = math.nan, math.inf
RNG = np.random.default_rng(20240917)
FIELDS = pw.VALUE_FIELDS


def at(values: np.ndarray, field: str) -> float:
    return float(values[FIELDS.index(field)])


# ------------------------------------------------------------------ the contract itself


def state_of(*rows: dict[str, list[float]]) -> np.ndarray:
    """One replica's state: each row's values folded in order by the reference fold."""
    state = pw.empty(len(rows))
    for i, row in enumerate(rows):
        for field, values in row.items():
            for v in values:
                pw.fold(state, i, field, v)
    return state


def test_the_layout_covers_every_probe_once():
    assert set(pw.MEANS) | set(pw.MAXIMA) == set(slots.PROBE_VALUE_FIELDS)
    columns = [*pw.SUM.values(), *pw.COUNT.values(), *pw.PEAK.values()]
    assert sorted(columns) == list(range(pw.WIDTH))
    assert all(pw.COUNT[f] == pw.SUM[f] + 1 for f in pw.MEANS)
    assert all(pw.PEAK[f] >= pw.MAXIMA_AT for f in pw.MAXIMA)
    empty = pw.empty(2)
    assert empty.shape == (2, pw.WIDTH)
    assert all(np.isnan(v).all() for v in pw.combine(empty, ["a", "b"]).values())


def test_combine_pools_means_over_every_replica_s_counted_values():
    a = state_of({"abs_median": [1.0, 2.0], "kurtosis": [NAN, 4.0], "logit_lse": [INF]})
    b = state_of({"abs_median": [6.0], "kurtosis": [-INF]})
    c = state_of({})  # a replica without a statistics step
    got = pw.combine([a, b, c], ["x"])["x"]
    assert at(got, "abs_median") == 3.0  # (1 + 2 + 6) / 3: the steps, not the replicas
    assert at(got, "kurtosis") == 4.0  # the non-finite values left out
    assert math.isnan(at(got, "logit_lse"))  # nothing finite anywhere
    np.testing.assert_array_equal(pw.combine(np.stack([a, b, c]), ["x"])["x"], got)


@pytest.mark.parametrize("peaks, want", [
    ([[3.0], [7.0, 1.0], []], 7.0),  # the largest over replicas and steps
    ([[3.0], [INF], [5.0]], INF),  # +inf is a real peak: kept
    ([[3.0, NAN, 9.0], [1.0], []], NAN),  # a NaN step stays visible, whatever follows
    ([[INF], [NAN], []], NAN),
    ([[], [], []], NAN),  # no value
    ([[-INF], [], []], NAN),  # -inf is no value
])
def test_combine_maxima_keep_inf_and_nan(peaks, want):
    states = [state_of({"attn_logit_max": p, "logit_max": p[::-1]}) for p in peaks]
    got = pw.combine(states, ["x"])["x"]
    for field in pw.MAXIMA:
        assert at(got, field) == want or (math.isnan(want) and math.isnan(at(got, field)))


def test_combine_rejects_a_state_of_another_layout():
    with pytest.raises(ValueError):
        pw.combine(np.zeros((2, pw.WIDTH + 1)), ["a", "b"])


def test_an_infinite_peak_reaches_the_event_file():
    """The PROBES matrix carries +inf (the contract keeps it); a finite value past float32
    is held at float32's largest."""
    m = summary_pb.probes_matrix(["x"], {"x": [1e39, 2.0, INF, NAN, 1.0]})
    assert m[0, 2] == np.finfo(np.float32).max and m[0, 4] == np.inf and np.isnan(m[0, 5])


@pytest.mark.parametrize("length", [0, 1, 2, 3, 63, 64, 65, 80, 127, 1000, 4097])
def test_query_rows_are_evenly_spread_from_the_first_to_the_last(length):
    rows = pw.query_rows(length)
    assert len(rows) == min(length, pw.QUERY_ROWS)
    if length <= pw.QUERY_ROWS:
        np.testing.assert_array_equal(rows, np.arange(length))
    else:
        assert rows[0] == 0 and rows[-1] == length - 1 and (np.diff(rows) >= 1).all()
    np.testing.assert_array_equal(torch_values.query_rows(length).numpy(), rows)


def test_batch_elements_keep_the_logits_within_the_budget():
    assert pw.batch_elements(10, budget=100) == 10
    assert pw.batch_elements(1000, budget=100) == 1  # at least one
    assert pw.batch_elements(0) == pw.LOGIT_BUDGET


# ------------------------------------------------------------------ the numbers, per producer

#: Layer outputs whose median |a| the three producers must give alike (at most
#: PROBE_SAMPLE_SIZE values: every value is the sample).
MEDIAN_CASES: dict[str, np.ndarray] = {
    "odd": np.array([3.0, -1.0, 2.0], np.float32),
    "even": np.array([4.0, -1.0, 3.0, 2.0], np.float32),  # the lower middle value: 2
    "ties": RNG.choice(np.array([-1.0, 0.0, 0.5, 2.0], np.float32), size=(64, 4)),
    "nan": np.array([NAN, 5.0, -1.0, NAN, 2.0, 3.0], np.float32),
    "inf": np.array([INF, -INF, 1.0, -4.0, 2.0], np.float32),  # ±inf left out: 2
    "all_nan": np.full(5, NAN, np.float32),
    "one": np.array([[-2.5]], np.float32),
    "full_sample": RNG.standard_t(4, size=(8, 16, 32)).astype(np.float32),  # 4096
}


def lower_median(x: np.ndarray) -> float:
    """The definition, written out: sort the finite |x|, take the ((n - 1) // 2)-th."""
    a = np.sort(np.abs(x[np.isfinite(x)]).astype(np.float64))
    return float(a[(len(a) - 1) // 2]) if len(a) else NAN


@pytest.mark.parametrize("case", sorted(MEDIAN_CASES))
def test_abs_median_of_every_producer(case):
    x = MEDIAN_CASES[case]
    want = lower_median(x)
    got = {
        "numpy": pw.abs_median(x),
        "keras": float(keras_values.abs_median(tf.constant(x), tf.constant([1, 2], tf.int64))),
        "torch": float(torch_values.abs_median(torch.from_numpy(x.reshape(-1)))),
    }
    for producer, g in got.items():
        assert g == want or (math.isnan(want) and math.isnan(g)), (producer, g, want)
    assert pw.abs_median(MEDIAN_CASES["even"]) == 2.0


KURTOSIS_CASES: dict[str, np.ndarray] = {
    "gauss": RNG.normal(size=(32, 16)).astype(np.float32),
    "heavy": RNG.standard_t(3, size=(32, 16)).astype(np.float32),
    "constant": np.ones((4, 3), np.float32),
    "nan": np.array([1.0, NAN, 2.0], np.float32),
}


@pytest.mark.parametrize("case", sorted(KURTOSIS_CASES))
def test_kurtosis_of_both_front_ends(case):
    x = KURTOSIS_CASES[case]
    want = pw.kurtosis(x)
    got = float(keras_values.kurtosis(tf.constant(x)))
    assert got == pytest.approx(want, rel=1e-4, nan_ok=True)
    if np.isfinite(want):
        d = x.astype(np.float64) - x.mean(dtype=np.float64)
        assert want == pytest.approx(np.mean(d**4) / np.mean(d**2) ** 2, rel=1e-12)


@pytest.mark.parametrize("length, causal, masked", [
    (10, False, False), (10, True, True), (80, True, False), (150, False, True),
])
def test_attention_logit_max_of_every_producer(length, causal, masked):
    """A long sequence is probed at the same evenly spread query rows by both front-ends;
    a padding mask (whose hidden keys hold the largest logits) and the causal mask apply."""
    b, n, e = 3, 2, 8
    q = RNG.normal(size=(b, n, length, e)).astype(np.float32)
    k = RNG.normal(size=(b, n, length, e)).astype(np.float32)
    k[..., -3:, :] *= 40  # the largest logits sit on the last keys
    keep = np.ones((b, 1, length, length), bool)
    if masked:
        keep[..., -3:] = False
    if causal:
        keep &= np.tril(np.ones((length, length), bool))
    want = pw.attention_logit_max(q, k, keep, scale=0.5)
    # Keras: [B, T, N, H], a mask [B, T, S] (true: attend) and its causal flag; PyTorch:
    # scaled_dot_product_attention's arguments (the causal part of a mask given again)
    got_keras = float(keras_values.attention_logit_max(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), keep[:, 0] if masked else None,
        causal, 0.5))
    got_torch = float(torch_values.logit_peak(
        torch.from_numpy(q), torch.from_numpy(k), (torch.from_numpy(keep),) if masked else (),
        is_causal=causal, scale=0.5))
    assert got_keras == pytest.approx(want, rel=1e-5)
    assert got_torch == pytest.approx(want, rel=1e-5)
    if length > pw.QUERY_ROWS:  # the rows matter: every row gives another maximum
        every = np.abs(np.einsum("bnte,bnse->bnts", q.astype(np.float64), k) * 0.5)
        assert want <= np.where(keep, every, 0.0).max()


def test_head_logits_of_both_front_ends():
    z = (RNG.normal(size=(3, 7, 11)) * 20).astype(np.float32)
    want = pw.head_logits(z)
    got = keras_values.head_logits(tf.constant(z)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    top = z.astype(np.float64).reshape(-1, 11).max(axis=1)
    assert want[1] > top.mean()  # the logsumexp of a row is above its largest logit


# ------------------------------------------------------------------ the device folds


#: One row's values over a window's statistics steps: finite, non-finite, none.
FOLDS = {
    "abs_median": [1.5, NAN, 2.5, INF],
    "kurtosis": [],
    "logit_lse": [-INF, 3.0],
    "attn_logit_max": [2.0, INF, 1.0],
    "logit_max": [4.0, NAN, 9.0],
}


def test_the_keras_device_state_folds_as_the_contract():
    rows = ["a", "b"]
    states = keras_probes.ProbeStates(rows, tf.distribute.get_strategy())
    want = pw.empty(2)
    for step in range(4):
        values = {f: [([1], tf.constant([v[step]], tf.float64))]
                  for f, v in FOLDS.items() if step < len(v)}
        for f, v in FOLDS.items():
            if step < len(v):
                pw.fold(want, 1, f, v[step])
        states.fold(states.update(values))
    np.testing.assert_array_equal(states.state.numpy(), want)
    point = states.read()
    for name in rows:
        np.testing.assert_array_equal(point[name], pw.combine(want, rows)[name])
    np.testing.assert_array_equal(states.state.numpy(), pw.empty(2))  # started again


def test_the_torch_device_state_folds_as_the_contract(tmp_path):
    model = TorchLM()
    with Introspector(tmp_path, model, every=1) as intro:
        probes = intro.probes
        want = pw.empty(len(probes.rows))
        i = probes.rows["mha"]
        for step in range(4):
            for f, v in FOLDS.items():
                if step < len(v):
                    value = torch.tensor(v[step], dtype=torch.float64)
                    (probes._mean if f in pw.MEANS else probes._peak)(i, f, value)
                    pw.fold(want, i, f, v[step])
            probes.settle()
        state, seen = probes.take()
        np.testing.assert_array_equal(state, want)
        assert seen == ["mha"]
        np.testing.assert_array_equal(probes.values(state[None], seen)["mha"],
                                      pw.combine(want, sorted(probes.rows,
                                                              key=probes.rows.get))["mha"])
        np.testing.assert_array_equal(probes.take()[0], pw.empty(len(probes.rows)))


# ------------------------------------------------------------------ one model, two front-ends

# A sequence longer than QUERY_ROWS (the query-row rule matters); every layer output holds
# at most PROBE_SAMPLE_SIZE values (every median is exact in both).
SEQ, VOCAB, WIDTH, HEADS, KEY_DIM, BATCH = 80, 16, 16, 2, 8, 3
assert SEQ > pw.QUERY_ROWS and BATCH * SEQ * max(WIDTH, VOCAB) <= pw.SAMPLE_SIZE
#: A token whose query is loud and whose key is not, at query rows the rule skips: the
#: largest logits of the batch are in rows no probe reads.
LOUD = 1


def weights() -> dict[str, np.ndarray]:
    """Keras's layouts: Embedding [V, W]; MultiHeadAttention's EinsumDense kernels
    [W, N, H] (query, key, value) and [N, H, W] (output), biases [N, H] and [W]."""
    r = np.random.default_rng(5)

    def normal(*shape, scale=1.0):
        return (r.normal(size=shape) * scale).astype(np.float32)

    w = {"embed": normal(VOCAB, WIDTH)}
    for name in ("query", "key", "value"):
        w[name] = normal(WIDTH, HEADS, KEY_DIM, scale=0.5)
        w[f"{name}_bias"] = normal(HEADS, KEY_DIM, scale=0.1)
    w["output"] = normal(HEADS, KEY_DIM, WIDTH, scale=0.3)
    w["output_bias"] = normal(WIDTH, scale=0.1)
    w["head"] = normal(WIDTH, VOCAB, scale=0.5)
    w["head_bias"] = normal(VOCAB, scale=0.1)
    w["embed"][LOUD] = 0.0
    w["embed"][LOUD, 0] = 30.0  # only the query reads the loud direction
    w["key"][0] = 0.0
    return w


def tokens() -> np.ndarray:
    x = np.random.default_rng(6).integers(2, VOCAB, (BATCH, SEQ))
    skipped = sorted(set(range(SEQ)) - set(pw.query_rows(SEQ).tolist()))
    x[:, skipped[3:6]] = LOUD
    return x


def keras_model(w: dict[str, np.ndarray]) -> keras.Model:
    keras.utils.set_random_seed(0)
    tok = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(tok)
    mha = keras.layers.MultiHeadAttention(HEADS, KEY_DIM, name="mha")
    h = mha(x, x, use_causal_mask=True)
    model = keras.Model(tok, keras.layers.Dense(VOCAB, name="head")(h))
    model.get_layer("embed").set_weights([w["embed"]])
    mha.set_weights([w[n] for n in ("query", "query_bias", "key", "key_bias", "value",
                                     "value_bias", "output", "output_bias")])
    model.get_layer("head").set_weights([w["head"], w["head_bias"]])
    model.compile(keras.optimizers.SGD(0.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class SelfAttention(nn.Module):
    """Keras's MultiHeadAttention as PyTorch writes it: projections, the fused kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(WIDTH, HEADS * KEY_DIM) for _ in "qkv")
        self.output = nn.Linear(HEADS * KEY_DIM, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).reshape(b, t, HEADS, KEY_DIM).transpose(1, 2)
                   for p in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output(y.transpose(1, 2).reshape(b, t, HEADS * KEY_DIM))


class TorchLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mha = SelfAttention()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.mha(self.embed(idx)))


def torch_model(w: dict[str, np.ndarray]) -> TorchLM:
    model = TorchLM()
    t = torch.from_numpy
    with torch.no_grad():
        model.embed.weight.copy_(t(w["embed"]))
        for name in ("query", "key", "value"):
            layer = getattr(model.mha, name)
            layer.weight.copy_(t(w[name].reshape(WIDTH, -1).T.copy()))
            layer.bias.copy_(t(w[f"{name}_bias"].reshape(-1)))
        model.mha.output.weight.copy_(t(w["output"].reshape(-1, WIDTH).T.copy()))
        model.mha.output.bias.copy_(t(w["output_bias"]))
        model.head.weight.copy_(t(w["head"].T.copy()))
        model.head.bias.copy_(t(w["head_bias"]))
    return model


def reference(w: dict[str, np.ndarray], x: np.ndarray) -> dict[str, dict[str, float]]:
    """The contract's values of the one step, from a float64 forward pass in numpy."""
    e = w["embed"][x].astype(np.float64)

    def project(name):
        return np.einsum("btw,wnh->bnth", e, w[name]) + w[f"{name}_bias"][None, :, None]

    q, k, v = project("query"), project("key"), project("value")
    causal = np.tril(np.ones((SEQ, SEQ), bool))
    logits = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(KEY_DIM), -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v
    att = np.einsum("bnth,nhw->btw", y, w["output"]) + w["output_bias"]
    z = att @ w["head"] + w["head_bias"]
    out = {name: {"abs_median": pw.abs_median(a.astype(np.float32)),
                  "kurtosis": pw.kurtosis(a)} for name, a in (("embed", e), ("mha", att),
                                                              ("head", z))}
    out["mha"]["attn_logit_max"] = pw.attention_logit_max(q, k, causal)
    out["head"]["logit_max"], out["head"]["logit_lse"] = pw.head_logits(z)
    out["every row"] = {"attn_logit_max": float(np.abs(np.where(causal, logits, 0)).max())}
    return out


def read_probes(log_dir: str) -> dict[str, dict[str, float]]:
    """Each row's probes at the run's one point, as the plugin reads them."""
    runs = provider.read_logdir(log_dir)
    assert len(runs) == 1
    p = probes_of(next(iter(runs.values())))
    assert p is not None and p.n_points == 1
    return {row: {f: float(p.field(f)[i, 0]) for f in FIELDS} for i, row in enumerate(p.rows)}


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """One statistics step of the same model on the same batch in each front-end."""
    w, x = weights(), tokens()
    y = np.roll(x, -1, 1)
    keras_dir = str(tmp_path_factory.mktemp("keras"))
    keras_model(w).fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                       callbacks=[Introspect(keras_dir, every=1)])
    torch_dir = str(tmp_path_factory.mktemp("torch"))
    model = torch_model(w)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Introspector(torch_dir, model, opt, every=1, criterion=nn.CrossEntropyLoss()) as intro:
        logits = model(torch.from_numpy(x))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), torch.from_numpy(y).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        intro.step(loss=loss)
    return read_probes(keras_dir), read_probes(torch_dir), reference(w, x)


#: Keras row -> the PyTorch row of the same number: a MultiHeadAttention layer's output is
#: the row of PyTorch's output projection (a leaf), its logits the attention module's row.
MATCHING = [
    ("embed", "embed", ("abs_median", "kurtosis")),
    ("mha", "mha.output", ("abs_median", "kurtosis")),
    ("mha", "mha", ("attn_logit_max",)),
    ("head", "head", ("abs_median", "kurtosis", "logit_max", "logit_lse")),
]
TOLERANCE = {"abs_median": 1e-5, "kurtosis": 1e-4, "attn_logit_max": 1e-5, "logit_max": 1e-5,
             "logit_lse": 1e-5}


def test_both_front_ends_write_the_contract_s_values(one_step):
    keras_rows, torch_rows, want = one_step
    assert {"embed", "mha", "head"} <= set(keras_rows)
    assert {"embed", "mha", "mha.output", "head"} <= set(torch_rows)
    for keras_row, torch_row, fields in MATCHING:
        for field in fields:
            ref = want["head" if keras_row == "head" else keras_row][field]
            got_keras, got_torch = keras_rows[keras_row][field], torch_rows[torch_row][field]
            rtol = TOLERANCE[field]
            assert got_keras == pytest.approx(got_torch, rel=rtol), (keras_row, field)
            assert got_keras == pytest.approx(ref, rel=rtol), (keras_row, field, "numpy")
            assert got_torch == pytest.approx(ref, rel=rtol), (torch_row, field, "numpy")


def test_a_probe_that_does_not_apply_is_nan_in_both(one_step):
    keras_rows, torch_rows, _ = one_step
    for rows, row in ((keras_rows, "embed"), (torch_rows, "embed"), (keras_rows, "mha"),
                      (torch_rows, "mha.output"), (torch_rows, "mha"), (keras_rows, "head"),
                      (torch_rows, "head")):
        applies = {f for keras_row, torch_row, fields in MATCHING for f in fields
                   if row == (torch_row if rows is torch_rows else keras_row)}
        for field in FIELDS:
            assert math.isnan(rows[row][field]) != (field in applies), (row, field)


def test_the_query_rows_rule_is_what_makes_them_equal(one_step):
    """The loud queries sit in rows the rule skips: reading every row (or others drawn at
    random) would give a far larger maximum than the one both front-ends agree on."""
    keras_rows, _, want = one_step
    assert want["every row"]["attn_logit_max"] > 3 * keras_rows["mha"]["attn_logit_max"]
