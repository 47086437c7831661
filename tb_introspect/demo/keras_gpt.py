"""The small GPT of ``gpt.py`` in Keras 3, trained by ``fit`` on the same Markov-chain
language, with the same stories: no QK-layernorm at a high AdamW rate (attention logits grow,
the loss diverges), QK-layernorm at the same rate, and a low rate.

The attention is ``keras.layers.MultiHeadAttention`` (``GPTAttention``): its QK-layernorm
normalises each head's projected queries and keys (no learned gain, as in ``gpt.py``), and
it can record the largest |q.k/sqrt(d)| of each forward pass in a variable (the direct
measurement the probes are checked against).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from keras import layers, ops  # noqa: E402

from tb_introspect.demo import gpt  # noqa: E402


def init() -> keras.initializers.Initializer:
    """N(0, 0.02), as GPT-2's and ``gpt.GPT``'s kernels and embeddings start: a new one per
    weight. A Keras initializer draws its seed when it is made and then gives the same
    values at every call, so one made at import would give every weight of a shape the same
    values, and each process others (its seed from the unseeded Python RNG, before
    ``set_random_seed``)."""
    return keras.initializers.RandomNormal(stddev=0.02)


EPS = 1e-5  # PyTorch's LayerNorm epsilon (Keras's default is 1e-3)


class _QKNormed(layers.Layer):
    """A query or key projection followed by a LayerNorm over each head's features."""

    def __init__(self, dense: layers.Layer, **kwargs: Any):
        super().__init__(**kwargs)
        self.dense = dense
        self.norm = layers.LayerNormalization(epsilon=EPS, center=False, scale=False)

    def build(self, input_shape: Any) -> None:
        self.norm.build(self.dense.compute_output_shape(input_shape))

    def call(self, x: Any) -> Any:
        return self.norm(self.dense(x))

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.dense.compute_output_shape(input_shape)


class GPTAttention(layers.MultiHeadAttention):
    """``MultiHeadAttention`` with an optional QK-layernorm; ``track_logits`` records the
    largest causal |q.k/sqrt(d)| of each forward pass in ``logit_max`` (self-attention with
    the causal mask or none, as ``build_gpt`` calls it)."""

    def __init__(self, num_heads: int, key_dim: int, qk_norm: bool = False,
                 track_logits: bool = False, **kwargs: Any):
        super().__init__(num_heads, key_dim, use_bias=False, kernel_initializer=init(), **kwargs)
        self.qk_norm, self.track_logits = qk_norm, track_logits

    def build(self, query_shape: Any, value_shape: Any, key_shape: Any = None) -> None:
        super().build(query_shape, value_shape, key_shape)
        if self.qk_norm:
            q, k = _QKNormed(self._query_dense), _QKNormed(self._key_dense)
            q.build(query_shape)
            k.build(value_shape if key_shape is None else key_shape)
            self._query_dense, self._key_dense = q, k
        self.logit_max = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                         name="logit_max")

    def call(self, query: Any, value: Any, key: Any = None, **kwargs: Any) -> Any:
        # The logits are recomputed from the projections here, not in _compute_attention:
        # the probes read only a MultiHeadAttention whose attention step is Keras's own.
        if self.track_logits:
            q = ops.stop_gradient(self._query_dense(query))
            k = ops.stop_gradient(self._key_dense(value if key is None else key))
            logits = ops.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(self._key_dim)
            t, s = ops.shape(logits)[-2], ops.shape(logits)[-1]
            keep = ops.greater_equal(ops.arange(t)[:, None], ops.arange(s)[None, :])
            if not kwargs.get("use_causal_mask", False):
                keep = ops.ones_like(keep)
            self.logit_max.assign(ops.max(ops.where(keep, ops.abs(logits), 0.0)))
        return super().call(query, value, key, **kwargs)


class TokenAndPosition(layers.Layer):
    """Token embeddings plus learned position embeddings."""

    def __init__(self, vocab: int, seq: int, width: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.vocab, self.seq, self.width = vocab, seq, width

    def build(self, input_shape: Any) -> None:
        self.tok = self.add_weight(shape=(self.vocab, self.width), initializer=init(), name="tok")
        self.pos = self.add_weight(shape=(self.seq, self.width), initializer=init(), name="pos")

    def call(self, ids: Any) -> Any:
        t = ops.shape(ids)[1]
        return ops.take(self.tok, ids, axis=0) + self.pos[None, :t]

    def compute_output_shape(self, input_shape: Any) -> Any:
        return (*input_shape, self.width)


def build_gpt(cfg: gpt.GPTConfig | None = None, track_logits: bool = False) -> keras.Model:
    """``gpt.GPT`` as a functional Keras model: ids ``[batch, seq]`` -> logits."""
    cfg = cfg or gpt.GPTConfig()
    ids = keras.Input((cfg.seq,), dtype="int32", name="ids")
    x = TokenAndPosition(cfg.vocab, cfg.seq, cfg.width, name="embed")(ids)
    for i in range(cfg.layers):
        a = layers.LayerNormalization(epsilon=EPS, name=f"block{i}_ln1")(x)
        a = GPTAttention(cfg.heads, cfg.width // cfg.heads, cfg.qk_norm, track_logits,
                         name=f"block{i}_attn")(a, a, use_causal_mask=True)
        x = layers.Add(name=f"block{i}_res1")([x, a])
        m = layers.LayerNormalization(epsilon=EPS, name=f"block{i}_ln2")(x)
        m = layers.Dense(4 * cfg.width, activation="gelu", kernel_initializer=init(),
                         name=f"block{i}_fc")(m)
        m = layers.Dense(cfg.width, kernel_initializer=init(), name=f"block{i}_out")(m)
        x = layers.Add(name=f"block{i}_res2")([x, m])
    x = layers.LayerNormalization(epsilon=EPS, name="ln_f")(x)
    logits = layers.Dense(cfg.vocab, use_bias=False, kernel_initializer=init(), name="head")(x)
    return keras.Model(ids, logits, name="gpt")


class _LogitTrace(keras.callbacks.Callback):
    """Reads each attention layer's ``logit_max`` after every batch."""

    def __init__(self, attns: list[GPTAttention]):
        super().__init__()
        self.attns, self.values = attns, []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.values.append(max(float(a.logit_max.numpy()) for a in self.attns))


class _Losses(keras.callbacks.Callback):
    """Each batch's own loss (``fit``'s logs hold the running mean over the epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        mean = float(logs["loss"])
        n = len(self.values)
        # fit reports the epoch's running mean: the batch's own loss is recovered from it.
        self.values.append(mean * (n + 1) - sum(self.values) if n else mean)


def train(story: gpt.Story, *, seed: int = 0, steps: int = gpt.STEPS,
          cfg: gpt.GPTConfig | None = None, track_logits: bool = True,
          log_dir: str | None = None, **options: Any) -> gpt.History:
    """Train ``story`` with ``model.fit`` for ``steps`` steps (one epoch of fresh chain
    batches); with ``log_dir``, ``tb_introspect.keras.Introspect`` follows it (a point every
    ``gpt.WINDOW`` steps unless ``options`` say otherwise) and the findings it judges while
    training runs go to ``History.live``."""
    keras.utils.set_random_seed(seed)
    cfg = cfg or gpt.GPTConfig(qk_norm=story.qk_norm)
    model = build_gpt(cfg, track_logits)
    attns = [la for la in model.layers if isinstance(la, GPTAttention)]
    lr = keras.optimizers.schedules.CosineDecay(  # alpha=1: a linear warm-up, then constant
        0.0, decay_steps=1, alpha=1.0, warmup_target=story.lr, warmup_steps=story.warmup)
    model.compile(
        optimizer=keras.optimizers.AdamW(lr, beta_2=0.95, weight_decay=story.weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = gpt.chain(steps * gpt.BATCH, cfg.seq, cfg.vocab, seed=seed)
    trace, losses = _LogitTrace(attns), _Losses()
    callbacks: list[Any] = [losses, trace] if track_logits else [losses]
    live: list[tuple[int, str]] = []
    if log_dir is not None:
        from tb_introspect.keras import Introspect

        callbacks.append(Introspect(log_dir, **{
            "every": "epoch", "window": gpt.WINDOW,
            "on_finding": lambda f: live.append((len(losses.values), f.kind)), **options}))
    model.fit(data[:, :-1], data[:, 1:], batch_size=gpt.BATCH, epochs=1, shuffle=False,
              callbacks=callbacks, verbose=0)
    logit_max = np.array(trace.values) if track_logits else np.full(steps, np.nan)
    return gpt.History(np.array(losses.values), logit_max, live)
