"""The Keras front-end's transformer probes (``keras/probes.py``) against direct
computations on the same batch, by the probes' contract (``pipeline/probe_window.py``):
layer outputs' lower median |a| and kurtosis, MultiHeadAttention's largest |logit| with and
without a causal mask, at the contract's query rows, the head's largest logit and
logsumexp; only from statistics steps; none with ``probes=False``. The contract's reduction
and the parity with PyTorch: ``tests/stats/test_probe_parity.py``."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tb_introspect import loss_field, slots  # noqa: E402
from tb_introspect.keras import (  # noqa: E402
    Introspect,
    Introspector,
    model_parts,
    probe_values,
    probes,
)
from tb_introspect.pipeline import probe_window  # noqa: E402
from tb_introspect.read import provider  # noqa: E402
from tb_introspect.read.series import Probes, probes_of  # noqa: E402

SEQ, VOCAB, WIDTH = 16, 30, 16


def read_probes(log_dir: str) -> Probes | None:
    runs = provider.read_logdir(log_dir)
    assert len(runs) == 1
    return probes_of(next(iter(runs.values())))


def value(p: Probes, row: str, field: str, point: int = -1) -> float:
    return float(p.field(field)[p.rows.index(row), point])


def kurtosis(a: np.ndarray) -> float:
    d = a.astype(np.float64).ravel() - a.mean(dtype=np.float64)
    return float(np.mean(d**4) / np.mean(d**2) ** 2)


def lse(z: np.ndarray) -> float:
    z = z.reshape(-1, z.shape[-1]).astype(np.float64)
    top = z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]))


def logits_of(layer: keras.layers.MultiHeadAttention, x: np.ndarray) -> np.ndarray:
    """[B, N, T, S] pre-softmax self-attention logits, from the layer's own projections."""
    q = np.asarray(layer.query_dense(x), np.float64)
    k = np.asarray(layer.key_dense(x), np.float64)
    return np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(layer.key_dim)


# ------------------------------------------------------------------ the in-graph numbers


def test_abs_median_and_kurtosis_of_a_batch():
    rng = np.random.default_rng(0)
    small = rng.standard_t(5, size=(8, 16, 32)).astype("float32")  # 4096 values: exact
    seed = tf.constant([3, 4], tf.int64)
    assert float(probe_values.abs_median(small, seed)) == probe_window.abs_median(small)
    assert float(probe_values.kurtosis(small)) == pytest.approx(kurtosis(small), rel=1e-4)
    gauss = rng.normal(size=(64, 4096)).astype("float32")  # sampled: 4096 of 262144
    assert float(probe_values.abs_median(gauss, seed)) == pytest.approx(0.6745, rel=0.05)
    assert float(probe_values.kurtosis(gauss)) == pytest.approx(3.0, rel=0.03)
    assert np.isnan(float(probe_values.kurtosis(np.ones((4, 3), "float32"))))


def test_attention_logit_max_with_padding_and_causal_masks():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(3, 10, 2, 4)).astype("float32")
    k = rng.normal(size=(3, 10, 2, 4)).astype("float32")
    k[:, -3:] *= 50  # the largest logits sit on keys the mask hides
    logits = np.abs(np.einsum("btnh,bsnh->bnts", q, k) * 0.5)
    keys = np.ones((3, 10), bool)
    keys[:, -3:] = False
    mask = np.broadcast_to(keys[:, None, :], (3, 10, 10))
    causal = np.tril(np.ones((10, 10), bool))
    for m, c, want in [(None, False, logits), (None, True, logits * causal),
                       (mask, False, logits * mask[:, None]),
                       (mask, True, logits * (mask & causal)[:, None])]:
        got = float(probe_values.attention_logit_max(q, k, m, c, 0.5))
        assert got == pytest.approx(want.max(), rel=1e-5)


def test_the_contract_s_query_rows_of_a_long_sequence():
    rng = np.random.default_rng(2)
    q = rng.normal(size=(2, 512, 2, 8)).astype("float32")
    k = rng.normal(size=(2, 512, 2, 8)).astype("float32")
    full = np.abs(np.einsum("btnh,bsnh->bnts", q, k)).max()
    want = probe_window.attention_logit_max(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                                            scale=1.0)  # 64 of 512 rows, evenly spread
    spec = tf.TensorSpec([None, None, 2, 8], tf.float32)  # a length known when it runs
    traced = tf.function(lambda q, k: probe_values.attention_logit_max(q, k, None, False, 1.0),
                         input_signature=[spec, spec])
    for got in (probe_values.attention_logit_max(q, k, None, False, 1.0), traced(q, k)):
        assert float(got) == pytest.approx(want, rel=1e-5)
    assert want <= full * (1 + 1e-6)
    assert probes.VALUE_FIELDS == slots.PROBE_VALUE_FIELDS


class Block(keras.layers.Layer):
    """A composite layer with its attention inside."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mha = keras.layers.MultiHeadAttention(2, 4, name="mha")

    def call(self, x):
        return x + self.mha(x, x)


@pytest.mark.parametrize("loss", ["ce", "mse"])
def test_nested_attention_layers_and_the_head_are_found(loss):
    inp = keras.Input((6, 8))
    x = Block(name="block")(inp)
    model = keras.Model(inp, keras.layers.Dense(5, name="head")(x))
    captured = model_parts.layers_to_capture(model)
    info = loss_field.loss_json("classification" if loss == "ce" else "regression")
    found = probes.discover(captured, [c.name for c in captured], info)
    # A regression's last Dense is no classifier head.
    assert found.rows == (["block/mha", "head"] if loss == "ce" else ["block/mha"])
    assert probes.discover(captured[1:], ["head"], loss_field.loss_json("regression")) is None


# ------------------------------------------------------------------ fit


def gpt(seed: int = 0) -> keras.Model:
    """Token embeddings, a causal and an unmasked attention layer, a language-model head."""
    keras.utils.set_random_seed(seed)
    tok = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(tok)
    h = keras.layers.MultiHeadAttention(2, 8, name="causal")(x, x, use_causal_mask=True)
    x = keras.layers.Add(name="add1")([x, h])
    h = keras.layers.MultiHeadAttention(2, 8, name="plain")(x, x)
    x = keras.layers.Add(name="add2")([x, h])
    model = keras.Model(tok, keras.layers.Dense(VOCAB, name="head")(x))
    # A zero learning rate leaves the weights the batch met: the direct computation after
    # fit() sees what the step saw.
    model.compile(keras.optimizers.SGD(0.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    model = gpt()
    rng = np.random.default_rng(0)
    x = rng.integers(2, VOCAB, (8, SEQ))
    # A loud last token whose query the causal layer zeroes: its key makes the largest
    # logits, all in rows the causal mask hides it from.
    x[:, -1] = 1
    table = model.get_layer("embed").embeddings
    loud = np.zeros((VOCAB, WIDTH), "float32")
    loud[1, 0] = 30.0
    table.assign(np.where(np.arange(VOCAB)[:, None] == 1, loud, np.asarray(table)))
    query = model.get_layer("causal").query_dense.kernel
    query.assign(np.asarray(query) * (np.arange(WIDTH) != 0)[:, None, None])
    log_dir = str(tmp_path_factory.mktemp("gpt"))
    model.fit(x, np.roll(x, -1, 1), batch_size=8, epochs=1, verbose=0, shuffle=False,
              callbacks=[Introspect(log_dir, every=1)])
    return model, x, read_probes(log_dir)


def test_every_probe_of_a_one_step_fit_is_the_batch_s(gpt_run):
    model, x, p = gpt_run
    names = ["embed", "causal", "add1", "plain", "add2", "head"]
    tap = keras.Model(model.inputs[0], [model.get_layer(n).output for n in names])
    outs = dict(zip(names, (np.asarray(o) for o in tap(x)), strict=True))
    assert set(names) <= set(p.rows)
    for name, a in outs.items():  # every output holds at most 4096 values: exact medians
        assert value(p, name, "abs_median") == pytest.approx(probe_window.abs_median(a),
                                                             rel=1e-5)
        assert value(p, name, "kurtosis") == pytest.approx(kurtosis(a), rel=1e-3)
    causal = np.tril(np.ones((SEQ, SEQ), bool))
    want = np.abs(logits_of(model.get_layer("causal"), outs["embed"])) * causal
    assert value(p, "causal", "attn_logit_max") == pytest.approx(want.max(), rel=1e-4)
    full = np.abs(logits_of(model.get_layer("plain"), outs["add1"]))
    assert value(p, "plain", "attn_logit_max") == pytest.approx(full.max(), rel=1e-4)
    assert want.max() < 0.5 * np.abs(logits_of(model.get_layer("causal"), outs["embed"])).max()
    assert value(p, "head", "logit_max") == pytest.approx(outs["head"].max(), rel=1e-5)
    assert value(p, "head", "logit_lse") == pytest.approx(lse(outs["head"]), rel=1e-5)
    for name in ("embed", "add1", "add2"):  # no attention, not the head
        for field in ("attn_logit_max", "logit_max", "logit_lse"):
            assert np.isnan(value(p, name, field))
    assert np.isnan(value(p, "head", "attn_logit_max"))


def classifier(seed: int = 0, loss: str = "ce", jit: bool = False) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, name="hidden"),
        keras.layers.Dense(3, activation="softmax" if loss == "ce" else None, name="head"),
    ])
    model.compile(keras.optimizers.SGD(0.0),
                  "sparse_categorical_crossentropy" if loss == "ce" else "mse", jit_compile=jit)
    return model


def scaled_batches() -> tuple[np.ndarray, np.ndarray]:
    """Four batches of 16; the second and the fourth 1000 times larger."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 4)).astype("float32")
    x[16:32] *= 1000
    x[48:] *= 1000
    return x, rng.integers(0, 3, 64)


@pytest.mark.parametrize("jit", [False, True])
def test_probes_come_from_statistics_steps_only(tmp_path, jit):
    model = classifier(jit=jit)
    x, y = scaled_batches()
    cb = Introspect(str(tmp_path), every="epoch", overhead=None, stats_every=2)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    cb.close()
    p = read_probes(str(tmp_path))
    hidden, head = model.layers
    stats = [x[0:16], x[32:48]]  # steps 1 and 3 of the epoch: its statistics steps
    h = [np.asarray(hidden(b)) for b in stats]
    z = [h_ @ np.asarray(head.kernel) + np.asarray(head.bias) for h_ in h]  # pre-softmax
    assert value(p, "hidden", "abs_median") == pytest.approx(
        np.mean([probe_window.abs_median(a) for a in h]), rel=1e-5)
    assert value(p, "hidden", "kurtosis") == pytest.approx(
        np.mean([kurtosis(a) for a in h]), rel=1e-3)
    assert value(p, "head", "logit_max") == pytest.approx(max(a.max() for a in z), rel=1e-5)
    assert value(p, "head", "logit_lse") == pytest.approx(np.mean([lse(a) for a in z]),
                                                          rel=1e-5)
    # The lean steps' batches are 1000 times larger: had they counted, the head's largest
    # logit would be about 1000 times this one.
    assert max(a.max() for a in z) < 0.01 * (
        np.asarray(hidden(x[16:32])) @ np.asarray(head.kernel)).max()


@pytest.mark.parametrize("case", ["probes=False", "regression"])
def test_no_probes_without_a_head_or_when_off(tmp_path, case):
    model = classifier(loss="mse" if case == "regression" else "ce")
    x, y = scaled_batches()
    y = np.eye(3)[y] if case == "regression" else y
    options = {"probes": False} if case == "probes=False" else {}
    cb = Introspect(str(tmp_path), every=2, **options)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    cb.close()
    run = next(iter(provider.read_logdir(str(tmp_path)).values()))
    assert run.probes is None or not len(run.probes)
    assert probes_of(run) is None
    assert len(run.tensors["output"]) == 2  # the views were written


# ------------------------------------------------------------------ the custom loop


def test_custom_loop_probes_of_its_statistics_steps(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 4))
    h = keras.layers.Dense(8, name="proj")(inp)
    a = keras.layers.MultiHeadAttention(2, 4, name="mha")(h, h, use_causal_mask=True)
    model = keras.Model(inp, keras.layers.Dense(5, name="logits")(a))
    proj, mha, head = (model.get_layer(n) for n in ("proj", "mha", "logits"))
    opt = keras.optimizers.SGD(0.0)  # the weights stay those the batches met
    intro = Introspector(str(tmp_path), every="epoch", stats_every=2, model=model)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            hidden = proj(x)
            z = head(mha(hidden, hidden, use_causal_mask=True))
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, z, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        intro.record(variables=model.trainable_variables, gradients=grads,
                     outputs={"proj": hidden, "logits": z}, metrics={"loss": loss},
                     head="logits")

    rng = np.random.default_rng(4)
    xs = [rng.normal(size=(4, 8, 4)).astype("float32") * (1000 if i % 2 else 1)
          for i in range(4)]  # the lean steps' batches (the second, the fourth) are loud
    for x in xs:
        train_step(x, rng.integers(0, 5, (4, 8)))
        intro.step()
    intro.end_epoch()
    intro.close()
    assert private_kernel_restored(mha)

    p = read_probes(str(tmp_path))
    assert set(p.rows) == {"proj", "logits", "mha"}
    stats = [xs[0], xs[2]]  # window steps 0 and 2: stats_every=2
    hs = [np.asarray(proj(x)) for x in stats]
    zs = [np.asarray(model(x)) for x in stats]
    causal = np.tril(np.ones((8, 8), bool))
    assert value(p, "proj", "abs_median") == pytest.approx(
        np.mean([probe_window.abs_median(h_) for h_ in hs]), rel=1e-5)
    assert value(p, "mha", "attn_logit_max") == pytest.approx(
        max((np.abs(logits_of(mha, h_)) * causal).max() for h_ in hs), rel=1e-4)
    assert value(p, "logits", "logit_max") == pytest.approx(max(z.max() for z in zs), rel=1e-5)
    assert value(p, "logits", "logit_lse") == pytest.approx(np.mean([lse(z) for z in zs]),
                                                            rel=1e-5)
    assert np.isnan(value(p, "proj", "logit_max"))


def private_kernel_restored(layer: keras.layers.Layer) -> bool:
    """``close()`` took the attention wrapper off: the layer's own method is back."""
    return "_compute_attention" not in layer.__dict__
