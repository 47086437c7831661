"""The healthy corpus: trainings that work, as users run them, on which no warning rule may
fire at any point.

Each run trains to its floor and sits there: classifiers on the digits (scikit-learn's, 8x8,
10 classes) to ~100% training accuracy under the schedules people use (cosine to zero, warm
restarts, one-cycle, step decay, label smoothing), small language models on the Markov-chain
language of ``tb_introspect/demo/gpt.py`` to its entropy (pre-LN and post-LN blocks, and stock
Hugging Face GPT-2, Llama and BERT built from small configs at their default initialisation),
frozen backbones, tiny and large batches, strong but healthy regularisation, runs of 3 epochs
and of 60 short ones. Four ways to train: Keras ``fit`` with ``Introspect``, a PyTorch loop
with the ``Introspector`` (one under FSDP2, a world of one gloo rank), the Hugging Face
``Trainer`` with ``IntrospectCallback`` and Lightning with ``Introspect``.

What a run shows is read twice: live, by ``on_finding`` (severity ``"info"``: every finding
the rules judge after each logged point, the tool's own live reading, which reads what
``tb-introspect diagnose`` reads from the files), and, in the Keras and PyTorch loops, by
reading the logdir back after every epoch or window (``read_logdir``, as a live tab).
``benchmarks/findings_validation.py --healthy`` trains them all and prints the table of
docs/findings.md ("The healthy corpus"); ``tests/diagnose/test_findings_healthy.py`` trains
a few in ``make test``.

The corpus was chosen before the rules were changed for it, and the rules must stay silent
on it: a warning here is a false positive to fix in the rule, never in the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SERIOUS = ("warning", "critical")


@dataclass(frozen=True)
class Healthy:
    """One healthy training: its framework, how it is trained, and what it is."""

    framework: str  # "keras", "torch", "hf", "lightning"
    train: str  # the trainer function's name in this module
    note: str
    kw: dict = field(default_factory=dict)


@dataclass
class Outcome:
    """What a run showed: every finding seen live or read back, by (point, kind, severity),
    the findings of the finished run, and how far it trained."""

    name: str
    seen: list[tuple[int, str, str, str]] = field(default_factory=list)  # point, kind, sev, title
    final: list = field(default_factory=list)
    end: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def warnings(self) -> list[tuple[int, str, str]]:
        """(point, kind, title) of the first time each warning or critical kind was seen."""
        out: dict[str, tuple[int, str, str]] = {}
        for point, kind, sev, title in self.seen:
            if sev in SERIOUS and kind not in out:
                out[kind] = (point, kind, title)
        for f in self.final:
            if f.severity in SERIOUS and f.kind not in out:
                out[f.kind] = (-1, f.kind, f.title)
        return sorted(out.values())


class Live:
    """The live readings of one run: ``on_finding``'s findings and the logdir read back."""

    def __init__(self, logdir: str, outcome: Outcome):
        self.logdir, self.outcome, self.point = logdir, outcome, 0

    def on_finding(self, f: Any) -> None:
        self.outcome.seen.append((self.point, f.kind, f.severity, f.title))

    def read_back(self) -> None:
        """Read the logdir (flushed by the caller) and judge it, as a live tab does."""
        from tb_introspect.diagnose import find_issues
        from tb_introspect.read import read_logdir

        self.point += 1
        for run in read_logdir(self.logdir).values():
            for f in find_issues(run):
                if f.severity in SERIOUS:
                    self.outcome.seen.append((self.point, f.kind, f.severity, f.title))

    def options(self) -> dict:
        return {"on_finding": self.on_finding, "on_finding_severity": "info", "seed": 0}


# ---------------------------------------------------------------- data


def digits(n_train: int | None = None):
    from tb_introspect.demo.data import load_digits

    d = load_digits(seed=0)
    if n_train is None:
        return d
    return type(d)(d.x_train[:n_train], d.y_train[:n_train], d.x_val, d.y_val)


def _steps(n: int, batch: int) -> int:
    return math.ceil(n / batch)


# ---------------------------------------------------------------- Keras classifiers


def _keras_schedule(kind: str, lr: float, steps_per_epoch: int, epochs: int):
    import keras

    total = steps_per_epoch * epochs
    if kind == "cosine":
        return keras.optimizers.schedules.CosineDecay(lr, total, alpha=0.0)
    if kind == "warmup_cosine":
        warm = max(1, total // 10)
        return keras.optimizers.schedules.CosineDecay(0.0, total - warm, alpha=0.0,
                                                      warmup_target=lr, warmup_steps=warm)
    if kind == "restarts":  # SGDR: a restart every 4 epochs, the same length each time
        return keras.optimizers.schedules.CosineDecayRestarts(lr, 4 * steps_per_epoch,
                                                              t_mul=1.0, m_mul=1.0, alpha=0.0)
    if kind == "step":
        b = [int(total * 0.5), int(total * 0.75)]
        return keras.optimizers.schedules.PiecewiseConstantDecay(b, [lr, lr / 10, lr / 100])
    if kind == "onecycle":
        return _one_cycle_class()(lr, total)
    return lr


def _one_cycle_class():
    """Keras's one-cycle schedule, made on first use (Keras is imported in the trainers
    only)."""
    import keras
    from keras import ops

    class OneCycle(keras.optimizers.schedules.LearningRateSchedule):
        """Smith's one-cycle: up from lr/25 over the first 30%, then cosine down to lr/1e4."""

        def __init__(self, peak: float, total: int):
            self.peak, self.total = peak, total

        def __call__(self, step):
            s = ops.cast(step, "float32")
            up = 0.3 * self.total
            lo = self.peak / 25
            rise = lo + (self.peak - lo) * s / up
            frac = ops.clip((s - up) / (self.total - up), 0.0, 1.0)
            fall = self.peak / 1e4 + (self.peak - self.peak / 1e4) * 0.5 * (
                1 + ops.cos(math.pi * frac))
            return ops.where(s < up, rise, fall)

        def get_config(self):
            return {"peak": self.peak, "total": self.total}

    return OneCycle


def keras_classifier(logdir: str, live: Live, *, body: str = "mlp", act: str = "relu",
                     opt: str = "adam", lr: float = 1e-3, schedule: str = "",
                     epochs: int = 12, batch: int = 32, n_train: int | None = None,
                     label_smoothing: float = 0.0, l2: float = 0.0, dropout: float = 0.0,
                     weight_decay: float = 0.0, frozen: bool = False) -> dict:
    """A digits MLP or CNN by ``model.fit`` with ``Introspect`` (per epoch, validation
    logged), the logdir read back after every epoch."""
    import keras
    from keras import layers

    from tb_introspect.keras import Introspect

    keras.utils.set_random_seed(0)
    d = digits(n_train)
    reg = keras.regularizers.L2(l2) if l2 else None

    def dense(n, name, a=None):
        return layers.Dense(n, activation=a, kernel_regularizer=reg, name=name)

    if body == "cnn":
        hidden = [layers.Conv2D(16, 3, padding="same", activation=act, kernel_regularizer=reg,
                                name="conv1"),
                  layers.Conv2D(32, 3, padding="same", activation=act, kernel_regularizer=reg,
                                name="conv2"),
                  layers.MaxPooling2D(name="pool"), layers.Flatten(name="flatten"),
                  dense(64, "dense1", act)]
    elif body == "bn_cnn":
        hidden = [layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv1"),
                  layers.BatchNormalization(momentum=0.9, name="bn1"),
                  layers.Activation(act, name="act1"),
                  layers.Conv2D(32, 3, padding="same", use_bias=False, name="conv2"),
                  layers.BatchNormalization(momentum=0.9, name="bn2"),
                  layers.Activation(act, name="act2"),
                  layers.GlobalAveragePooling2D(name="gap")]
    else:
        hidden = [layers.Flatten(name="flatten"), dense(128, "dense1", act)]
        if dropout:
            hidden.append(layers.Dropout(dropout, name="drop1"))
        hidden.append(dense(128, "dense2", act))
        if dropout:
            hidden.append(layers.Dropout(dropout, name="drop2"))
    head = layers.Dense(10, name="classifier")
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"), *hidden, head],
                             name=f"healthy_{body}")
    steps = _steps(len(d.x_train), batch)
    if frozen:
        # A backbone trained first (not logged), then frozen, and a fresh head trained on it:
        # what fine-tuning a linear probe on a pretrained feature extractor looks like.
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(d.x_train, d.y_train, batch_size=32, epochs=3, verbose=0)
        for layer in hidden:
            layer.trainable = False
        head.set_weights([np.asarray(w) * 0 for w in head.get_weights()])
    rate = _keras_schedule(schedule, lr, steps, epochs)
    if opt == "sgd":
        optimizer = keras.optimizers.SGD(rate, momentum=0.9, nesterov=True)
    elif opt == "adamw":
        optimizer = keras.optimizers.AdamW(rate, weight_decay=weight_decay or 0.01)
    else:
        optimizer = keras.optimizers.Adam(rate)
    y_tr, y_va = d.y_train, d.y_val
    if label_smoothing:
        loss = keras.losses.CategoricalCrossentropy(from_logits=True,
                                                    label_smoothing=label_smoothing)
        y_tr, y_va = (keras.utils.to_categorical(y, 10) for y in (y_tr, y_va))
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
    intro = Introspect(logdir, every="epoch", **live.options())
    end: dict[str, float] = {}

    class ReadBack(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # Introspect, listed first, has logged
            intro.pipeline.flush()
            live.read_back()
            end.update({k: float(v) for k, v in (logs or {}).items()})

    model.fit(d.x_train, y_tr, batch_size=batch, epochs=epochs, verbose=0, shuffle=True,
              validation_data=(d.x_val, y_va), callbacks=[intro, ReadBack()])
    keras.backend.clear_session()
    return end


# ---------------------------------------------------------------- Keras language models


def _keras_postln_gpt(cfg):
    """``keras_gpt.build_gpt`` with post-LN blocks (the original Transformer's order:
    LayerNorm after each residual sum), the model's own default initialisation."""
    import keras
    from keras import layers

    from tb_introspect.demo.keras_gpt import EPS, TokenAndPosition

    ids = keras.Input((cfg.seq,), dtype="int32", name="ids")
    x = TokenAndPosition(cfg.vocab, cfg.seq, cfg.width, name="embed")(ids)
    for i in range(cfg.layers):
        a = layers.MultiHeadAttention(cfg.heads, cfg.width // cfg.heads, name=f"block{i}_attn")(
            x, x, use_causal_mask=True)
        x = layers.LayerNormalization(epsilon=EPS, name=f"block{i}_ln1")(
            layers.Add(name=f"block{i}_res1")([x, a]))
        m = layers.Dense(4 * cfg.width, activation="gelu", name=f"block{i}_fc")(x)
        m = layers.Dense(cfg.width, name=f"block{i}_out")(m)
        x = layers.LayerNormalization(epsilon=EPS, name=f"block{i}_ln2")(
            layers.Add(name=f"block{i}_res2")([x, m]))
    logits = layers.Dense(cfg.vocab, use_bias=False, name="head")(x)
    return keras.Model(ids, logits, name="postln_gpt")


def keras_lm(logdir: str, live: Live, *, arch: str = "preln", width: int = 64, steps: int = 400,
             lr: float = 3e-3, warmup: int = 40, schedule: str = "constant",
             window: int = 20, weight_decay: float = 0.0) -> dict:
    """A small causal LM on the chain by ``fit`` (one epoch of fresh batches, a point every
    ``window`` steps), the logdir read back at each point."""
    import keras

    from tb_introspect.demo import gpt, keras_gpt
    from tb_introspect.keras import Introspect

    keras.utils.set_random_seed(0)
    cfg = gpt.GPTConfig(width=width, heads=2, layers=2)
    model = keras_gpt.build_gpt(cfg) if arch == "preln" else _keras_postln_gpt(cfg)
    if schedule == "cosine":
        rate = keras.optimizers.schedules.CosineDecay(0.0, steps - warmup, alpha=0.0,
                                                      warmup_target=lr, warmup_steps=warmup)
    else:
        rate = keras.optimizers.schedules.CosineDecay(0.0, 1, alpha=1.0, warmup_target=lr,
                                                      warmup_steps=warmup)
    model.compile(optimizer=keras.optimizers.AdamW(rate, beta_2=0.95,
                                                   weight_decay=weight_decay),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = gpt.chain(steps * gpt.BATCH, cfg.seq, cfg.vocab, seed=0)
    intro = Introspect(logdir, every="epoch", window=window, **live.options())
    losses: list[float] = []

    class ReadBack(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float((logs or {}).get("loss", np.nan)))
            if (batch + 1) % window == 0:
                intro.pipeline.flush()
                live.read_back()

    model.fit(data[:, :-1], data[:, 1:], batch_size=gpt.BATCH, epochs=1, shuffle=False,
              callbacks=[intro, ReadBack()], verbose=0)
    keras.backend.clear_session()
    return {"loss": losses[-1], "floor": gpt.entropy_floor()}


# ---------------------------------------------------------------- PyTorch classifiers


def _torch_body(body: str, act: str, dropout: float):
    from torch import nn

    a = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}[act]
    if body == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), a(), nn.Conv2d(16, 32, 3, padding=1),
                             a(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 64), a())
    if body == "bn_cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), a(),
                             nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), a(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten())
    layers: list = [nn.Flatten(), nn.Linear(64, 128), a()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(128, 128), a()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def _torch_schedule(opt, kind: str, lr: float, per_epoch: int, epochs: int):
    import torch

    total = per_epoch * epochs
    s = torch.optim.lr_scheduler
    if kind == "cosine":
        return s.CosineAnnealingLR(opt, total, eta_min=0.0)
    if kind == "restarts":
        return s.CosineAnnealingWarmRestarts(opt, T_0=4 * per_epoch)
    if kind == "onecycle":
        return s.OneCycleLR(opt, max_lr=lr, total_steps=total)
    if kind == "step":
        return s.MultiStepLR(opt, [int(total * 0.5), int(total * 0.75)], gamma=0.1)
    if kind == "warmup_cosine":
        warm = max(1, total // 10)
        return s.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (
            1 + math.cos(math.pi * min(1.0, max(0, i - warm) / (total - warm)))))
    return None


def torch_classifier(logdir: str, live: Live, *, body: str = "mlp", act: str = "relu",
                     opt: str = "adam", lr: float = 1e-3, schedule: str = "", epochs: int = 12,
                     batch: int = 32, n_train: int | None = None, label_smoothing: float = 0.0,
                     dropout: float = 0.0, weight_decay: float = 0.0,
                     frozen: bool = False, clip: float = 0.0) -> dict:
    """A digits MLP or CNN in a plain PyTorch loop with the ``Introspector`` (per epoch,
    its criterion declared, validation logged), the logdir read back after every epoch."""
    import torch
    from torch import nn

    from tb_introspect.torch import Introspector

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    d = digits(n_train)
    # Images [N, 1, 8, 8]: every body starts with a Flatten or a convolution.
    x_tr = torch.tensor(d.x_train.reshape(-1, 1, 8, 8), dtype=torch.float32)
    y_tr = torch.tensor(d.y_train, dtype=torch.long)
    x_va = torch.tensor(d.x_val.reshape(-1, 1, 8, 8), dtype=torch.float32)
    y_va = torch.tensor(d.y_val, dtype=torch.long)
    feats = _torch_body(body, act, dropout)
    width = 32 if body == "bn_cnn" else (64 if body == "cnn" else 128)
    model = nn.Sequential(*feats, nn.Linear(width, 10))
    criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    if frozen:  # pretrained for 3 epochs (not logged), then frozen under a fresh head
        pre = torch.optim.Adam(model.parameters(), 1e-3)
        for _ in range(3):
            for idx in torch.randperm(len(x_tr)).split(32):
                pre.zero_grad()
                criterion(model(x_tr[idx]), y_tr[idx]).backward()
                pre.step()
        feats.requires_grad_(False)
        model[-1].reset_parameters()
    params = [p for p in model.parameters() if p.requires_grad]
    if opt == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True,
                                    weight_decay=weight_decay)
    elif opt == "adamw":
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay or 0.01)
    else:
        optimizer = torch.optim.Adam(params, lr=lr)
    n = len(x_tr)
    per_epoch = _steps(n, batch)
    sched = _torch_schedule(optimizer, schedule, lr, per_epoch, epochs)
    end: dict[str, float] = {}
    with Introspector(logdir, model, optimizer, every="epoch", criterion=criterion,
                      **live.options()) as intro:
        for _ in range(epochs):
            model.train()
            order = torch.as_tensor(rng.permutation(n))
            correct = total_loss = 0.0
            for b in range(per_epoch):
                idx = order[b * batch:(b + 1) * batch]
                out = model(x_tr[idx])
                loss = criterion(out, y_tr[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if clip:
                    nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                if sched is not None:
                    sched.step()
                acc = float((out.argmax(1) == y_tr[idx]).float().mean())
                correct += acc * len(idx)
                total_loss += float(loss.detach()) * len(idx)
                intro.step(loss=loss.detach(), accuracy=acc)
            model.eval()
            with torch.no_grad():
                out = model(x_va)
                val_loss = float(criterion(out, y_va))
                val_acc = float((out.argmax(1) == y_va).float().mean())
            intro.end_epoch(val_loss=val_loss, val_accuracy=val_acc)
            intro.flush()
            live.read_back()
            end = {"loss": total_loss / n, "accuracy": correct / n, "val_loss": val_loss,
                   "val_accuracy": val_acc}
    return end


# ---------------------------------------------------------------- PyTorch language models


def _postln_gpt(cfg):
    """``gpt.GPT`` with post-LN blocks: LayerNorm after each residual sum, no final norm."""
    from torch import nn

    from tb_introspect.demo import gpt

    class PostLNBlock(gpt.Block):
        def forward(self, x):
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.mlp(x))

    model = gpt.GPT(cfg)
    model.blocks = nn.Sequential(*[PostLNBlock(cfg) for _ in range(cfg.layers)])
    model.ln_f = nn.Identity()
    for m in model.blocks.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def torch_lm(logdir: str, live: Live, *, arch: str = "preln", width: int = 64, steps: int = 400,
             lr: float = 3e-3, warmup: int = 40, schedule: str = "constant",
             window: int = 20, weight_decay: float = 0.0, fsdp: bool = False,
             batch: int = 16, clip: float = 0.0) -> dict:
    """A small causal LM on the chain in a plain loop (one epoch of fresh batches, a point
    every ``window`` steps), the logdir read back at each point. ``fsdp``: the blocks and the
    root under FSDP2's ``fully_shard``, in a world of one gloo rank."""
    import torch
    from torch import nn

    from tb_introspect.demo import gpt
    from tb_introspect.torch import Introspector

    torch.manual_seed(0)
    cfg = gpt.GPTConfig(width=width, heads=2, layers=2)
    model = gpt.GPT(cfg) if arch == "preln" else _postln_gpt(cfg)
    group = False
    if fsdp:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
            dist.init_process_group("gloo", rank=0, world_size=1)
            group = True
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                                  weight_decay=weight_decay)

    def factor(i: int) -> float:
        w = min(1.0, (i + 1) / warmup)
        if schedule == "cosine":
            return w * 0.5 * (1 + math.cos(math.pi * min(1.0, max(0, i - warmup)
                                                          / (steps - warmup))))
        return w

    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    data = gpt.batches(0, batch=batch, seq=cfg.seq, vocab=cfg.vocab)
    losses: list[float] = []
    try:
        with Introspector(logdir, model, optimizer, every="epoch", window=window,
                          criterion=nn.CrossEntropyLoss(), **live.options()) as intro:
            for i in range(steps):
                ids = next(data)
                loss = gpt.lm_loss(model(ids[:, :-1]), ids[:, 1:])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if clip:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                sched.step()
                losses.append(float(loss.detach()))
                intro.step(loss=loss.detach())
                if (i + 1) % window == 0:
                    intro.flush()
                    live.read_back()
            intro.end_epoch()
    finally:
        if group:
            import torch.distributed as dist

            dist.destroy_process_group()
    return {"loss": float(np.mean(losses[-window:])), "floor": gpt.entropy_floor()}


# ---------------------------------------------------------------- Hugging Face Trainer


def _hf_model(kind: str, width: int):
    from tb_introspect.demo import gpt

    if kind == "gpt2":
        return gpt.gpt2(width=width, heads=2, layers=2)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(
            vocab_size=gpt.VOCAB, hidden_size=width, intermediate_size=2 * width,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=gpt.SEQ, bos_token_id=0, eos_token_id=0, pad_token_id=0,
            tie_word_embeddings=False))
    if kind == "bert":  # the stock BERT encoder as a causal LM (is_decoder), LM head on top
        from transformers import BertConfig, BertLMHeadModel

        return BertLMHeadModel(BertConfig(
            vocab_size=gpt.VOCAB, hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=2 * width, max_position_embeddings=gpt.SEQ, is_decoder=True,
            pad_token_id=0))
    raise ValueError(kind)


def hf_run(logdir: str, live: Live, *, model: str = "gpt2", width: int = 64, steps: int = 400,
           lr: float = 3e-3, schedule: str = "constant_with_warmup", warmup: int = 40,
           weight_decay: float = 0.0, clip: float = 1.0, batch: int = 16,
           window: int = 20) -> dict:
    """A stock HF model built from a small config, trained by the ``Trainer`` with
    ``IntrospectCallback`` (a point every ``window`` steps): a causal LM on the chain for
    ``steps`` steps."""
    import torch
    from transformers import Trainer, TrainingArguments

    from tb_introspect.demo import gpt
    from tb_introspect.transformers import IntrospectCallback

    torch.manual_seed(0)
    net = _hf_model(model, width)
    common = dict(per_device_train_batch_size=batch, learning_rate=lr, lr_scheduler_type=schedule,
                  warmup_steps=warmup, adam_beta2=0.95, weight_decay=weight_decay,
                  max_grad_norm=clip, logging_steps=1, save_strategy="no", report_to="none",
                  use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    args = TrainingArguments(logdir, max_steps=steps, **common)
    train, val = gpt.ChainStream(0), None
    cb = IntrospectCallback(every="epoch", window=window, overhead=None, **live.options())
    from transformers import PrinterCallback, TrainerCallback

    class Point(TrainerCallback):
        """The point a live finding is seen at: the optimizer step, in windows."""

        def on_step_end(self, args, state, control, **kwargs):
            live.point = state.global_step // window

    trainer = Trainer(model=net, args=args, train_dataset=train, eval_dataset=val,
                      callbacks=[cb, Point()])
    trainer.remove_callback(PrinterCallback)  # each step's logs on stdout: not for a table
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {"loss": float(np.mean(losses[-10:])), "floor": gpt.entropy_floor()}


# ---------------------------------------------------------------- Lightning


def lightning_run(logdir: str, live: Live, *, body: str = "mlp", lr: float = 1e-3,
                  schedule: str = "", epochs: int = 12, batch: int = 32, lm: bool = False,
                  steps: int = 300) -> dict:
    """A digits MLP/CNN (validated each epoch), or the small pre-LN GPT on the chain, by a
    ``LightningModule`` under ``lightning.Trainer`` with ``Introspect`` beside a
    ``TensorBoardLogger``."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch import nn

    from tb_introspect.demo import gpt
    from tb_introspect.lightning import IntrospectCallback as Introspect

    torch.manual_seed(0)
    d = digits()
    end: dict[str, float] = {}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            if lm:
                self.net = gpt.GPT(gpt.GPTConfig(width=64, heads=2, layers=2))
            else:
                feats = _torch_body(body, "relu", 0.0)
                self.net = nn.Sequential(*feats, nn.Linear(64 if body == "cnn" else 128, 10))
            self.loss_fn = nn.CrossEntropyLoss()

        def forward(self, x):
            return self.net(x)

        def training_step(self, b, i):
            if lm:
                (ids,) = b
                out = self.net(ids[:, :-1])
                loss = self.loss_fn(out.reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1))
            else:
                x, y = b
                loss = self.loss_fn(self.net(x), y)
            end["loss"] = float(loss.detach())
            self.log("train_loss", loss)
            return loss

        def validation_step(self, b, i):
            x, y = b
            out = self.net(x)
            self.log("val_loss", self.loss_fn(out, y))
            self.log("val_accuracy", (out.argmax(1) == y).float().mean())

        def configure_optimizers(self):
            o = torch.optim.Adam(self.parameters(), lr=lr)
            total = steps if lm else epochs * _steps(len(d.x_train), batch)
            s = _torch_schedule(o, schedule, lr, total // max(1, epochs), max(1, epochs))
            if lm or s is None:
                return o
            return {"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}}

    tds = torch.utils.data.TensorDataset
    if lm:
        ids = gpt.markov_tokens(steps * gpt.BATCH, seed=0)
        train = torch.utils.data.DataLoader(tds(ids), batch_size=gpt.BATCH)
        val, epochs_run, cb = None, 1, Introspect(every="epoch", window=20, **live.options())
    else:
        x_tr = torch.tensor(d.x_train.reshape(-1, 1, 8, 8))
        x_va = torch.tensor(d.x_val.reshape(-1, 1, 8, 8))
        train = torch.utils.data.DataLoader(tds(x_tr, torch.tensor(d.y_train).long()),
                                            batch_size=batch, shuffle=True)
        val = torch.utils.data.DataLoader(tds(x_va, torch.tensor(d.y_val).long()),
                                          batch_size=256)
        epochs_run, cb = epochs, Introspect(every="epoch", **live.options())
    class Point(L.Callback):
        """The point a live finding is seen at: the epoch, or the window of 20 steps."""

        def on_train_batch_end(self, trainer, *args):
            live.point = trainer.global_step // 20 if lm else trainer.current_epoch

    trainer = L.Trainer(max_epochs=epochs_run, logger=TensorBoardLogger(logdir, name="pl"),
                        callbacks=[cb, Point()], enable_checkpointing=False,
                        enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1,
                        num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(Module(), train, val)
    return end


# ---------------------------------------------------------------- the corpus

K, T, H, P = "keras", "torch", "hf", "lightning"

CORPUS: dict[str, Healthy] = {
    # Keras classifiers, trained to ~100% training accuracy
    "k_gelu_adamw_mlp": Healthy(K, "keras_classifier", "GELU MLP, AdamW 3e-3, 20 epochs",
                                dict(act="gelu", opt="adamw", lr=3e-3, epochs=20)),
    "k_cnn_cosine": Healthy(K, "keras_classifier", "CNN, Adam 3e-3 cosine to zero, 15 epochs",
                            dict(body="cnn", lr=3e-3, schedule="cosine", epochs=15)),
    "k_cnn_restarts": Healthy(K, "keras_classifier",
                              "CNN, SGD-Nesterov 0.05, warm restarts every 4 epochs, 16 epochs",
                              dict(body="cnn", opt="sgd", lr=0.05, schedule="restarts",
                                   epochs=16)),
    "k_mlp_onecycle": Healthy(K, "keras_classifier", "MLP, one-cycle to 1e-2, 15 epochs",
                              dict(lr=1e-2, schedule="onecycle", epochs=15)),
    "k_mlp_label_smoothing": Healthy(K, "keras_classifier",
                                     "MLP, label smoothing 0.1, Adam 1e-3, 20 epochs",
                                     dict(label_smoothing=0.1, epochs=20)),
    "k_bn_cnn_step": Healthy(K, "keras_classifier",
                             "BatchNorm CNN, SGD 0.1 step decay, 12 epochs",
                             dict(body="bn_cnn", opt="sgd", lr=0.1, schedule="step",
                                  epochs=12)),
    "k_tiny_batch": Healthy(K, "keras_classifier", "MLP, batch 4, Adam 3e-4, 6 epochs",
                            dict(batch=4, lr=3e-4, epochs=6)),
    "k_large_batch": Healthy(K, "keras_classifier", "MLP, batch 512, Adam 1e-2, 40 epochs",
                             dict(batch=512, lr=1e-2, epochs=40)),
    "k_frozen_backbone": Healthy(K, "keras_classifier",
                                 "pretrained MLP frozen, fresh head, Adam 1e-2, 10 epochs",
                                 dict(frozen=True, lr=1e-2, epochs=10)),
    "k_strong_reg": Healthy(K, "keras_classifier",
                            "MLP, dropout 0.5 and L2 1e-3, Adam 1e-3, 20 epochs",
                            dict(dropout=0.5, l2=1e-3, epochs=20)),
    "k_three_epochs": Healthy(K, "keras_classifier", "CNN, Adam 1e-3, 3 epochs",
                              dict(body="cnn", epochs=3)),
    "k_sixty_short": Healthy(K, "keras_classifier",
                             "MLP on 256 samples, batch 64, warm-up + cosine, 60 epochs",
                             dict(n_train=256, batch=64, lr=3e-3, schedule="warmup_cosine",
                                  epochs=60)),
    # Keras language models, to the chain's entropy
    "k_preln_lm": Healthy(K, "keras_lm", "pre-LN GPT (width 64), AdamW 3e-3, 400 steps",
                          dict(arch="preln")),
    "k_postln_lm": Healthy(K, "keras_lm",
                           "post-LN transformer (width 64), Keras default init, AdamW 1e-3,"
                           " 400 steps", dict(arch="postln", lr=1e-3)),
    "k_preln_lm_cosine": Healthy(K, "keras_lm",
                                 "pre-LN GPT, AdamW 3e-3 cosine to zero, wd 0.1, 400 steps",
                                 dict(schedule="cosine", weight_decay=0.1)),
    # PyTorch loops, classifiers
    "t_gelu_adamw_mlp": Healthy(T, "torch_classifier", "GELU MLP, AdamW 3e-3, 20 epochs",
                                dict(act="gelu", opt="adamw", lr=3e-3, epochs=20)),
    "t_cnn_cosine": Healthy(T, "torch_classifier", "CNN, Adam 3e-3 cosine to zero, 15 epochs",
                            dict(body="cnn", lr=3e-3, schedule="cosine", epochs=15)),
    "t_cnn_restarts": Healthy(T, "torch_classifier",
                              "CNN, SGD-Nesterov 0.05, warm restarts every 4 epochs, 16 epochs",
                              dict(body="cnn", opt="sgd", lr=0.05, schedule="restarts",
                                   epochs=16)),
    "t_cnn_onecycle": Healthy(T, "torch_classifier", "CNN, OneCycleLR to 1e-2, 15 epochs",
                              dict(body="cnn", lr=1e-2, schedule="onecycle", epochs=15)),
    "t_mlp_label_smoothing": Healthy(T, "torch_classifier",
                                     "MLP, label smoothing 0.1, Adam 1e-3, 20 epochs",
                                     dict(label_smoothing=0.1, epochs=20)),
    "t_bn_cnn_step": Healthy(T, "torch_classifier",
                             "BatchNorm CNN, SGD 0.1 step decay, wd 5e-4, 12 epochs",
                             dict(body="bn_cnn", opt="sgd", lr=0.1, schedule="step",
                                  weight_decay=5e-4, epochs=12)),
    "t_tiny_batch": Healthy(T, "torch_classifier", "MLP, batch 2, SGD 0.01, 4 epochs",
                            dict(batch=2, opt="sgd", lr=0.01, epochs=4)),
    "t_full_batch": Healthy(T, "torch_classifier",
                            "MLP, full batch (1437), Adam 1e-2, 60 epochs",
                            dict(batch=1437, lr=1e-2, epochs=60)),
    "t_frozen_backbone": Healthy(T, "torch_classifier",
                                 "pretrained MLP frozen, fresh head, Adam 1e-2, 10 epochs",
                                 dict(frozen=True, lr=1e-2, epochs=10)),
    "t_strong_reg": Healthy(T, "torch_classifier",
                            "MLP, dropout 0.5 and AdamW wd 0.1, 20 epochs",
                            dict(dropout=0.5, opt="adamw", weight_decay=0.1, lr=1e-3,
                                 epochs=20)),
    "t_three_epochs": Healthy(T, "torch_classifier", "CNN, Adam 1e-3, 3 epochs",
                              dict(body="cnn", epochs=3)),
    "t_sixty_short": Healthy(T, "torch_classifier",
                             "MLP on 256 samples, batch 64, warm-up + cosine, 60 epochs",
                             dict(n_train=256, batch=64, lr=3e-3, schedule="warmup_cosine",
                                  epochs=60)),
    "t_silu_clip": Healthy(T, "torch_classifier",
                           "SiLU MLP, Adam 3e-3, gradient clipping 1.0, 15 epochs",
                           dict(act="silu", lr=3e-3, clip=1.0, epochs=15)),
    # PyTorch loops, language models
    "t_preln_lm": Healthy(T, "torch_lm", "pre-LN GPT (width 64), AdamW 3e-3, 400 steps",
                          dict(arch="preln")),
    "t_postln_lm": Healthy(T, "torch_lm", "post-LN transformer (width 64), AdamW 1e-3, 400 steps",
                           dict(arch="postln", lr=1e-3)),
    "t_preln_lm_fsdp2": Healthy(T, "torch_lm",
                                "the pre-LN GPT under FSDP2 (one gloo rank), 400 steps",
                                dict(arch="preln", fsdp=True)),
    "t_preln_lm_cosine": Healthy(T, "torch_lm",
                                 "pre-LN GPT, AdamW 3e-3 cosine to zero, wd 0.1, clip 1,"
                                 " 400 steps",
                                 dict(schedule="cosine", weight_decay=0.1, clip=1.0)),
    "t_preln_lm_long": Healthy(T, "torch_lm",
                               "pre-LN GPT (width 32), AdamW 1e-3, 800 steps at the floor",
                               dict(width=32, lr=1e-3, steps=800, window=40)),
    # Hugging Face Trainer, stock models from small configs, default initialisation
    "hf_gpt2": Healthy(H, "hf_run", "GPT-2 (width 64), AdamW 3e-3, 400 steps",
                       dict(model="gpt2")),
    "hf_gpt2_cosine": Healthy(H, "hf_run", "GPT-2, AdamW 1e-3 cosine, wd 0.1, 400 steps",
                              dict(model="gpt2", lr=1e-3, schedule="cosine",
                                   weight_decay=0.1)),
    "hf_llama": Healthy(H, "hf_run", "Llama (width 64, GQA), AdamW 3e-3, 400 steps",
                        dict(model="llama")),
    "hf_llama_high_lr": Healthy(H, "hf_run",
                                "Llama at a high rate: AdamW 1e-2, clip 1, 400 steps",
                                dict(model="llama", lr=1e-2)),
    "hf_llama_cosine": Healthy(H, "hf_run", "Llama, AdamW 1e-3 cosine, wd 0.1, 400 steps",
                               dict(model="llama", lr=1e-3, schedule="cosine",
                                    weight_decay=0.1)),
    "hf_bert": Healthy(H, "hf_run",
                       "BERT (post-LN, width 64) as a causal LM, AdamW 1e-3 linear decay,"
                       " 400 steps", dict(model="bert", lr=1e-3, schedule="linear")),
    # Lightning
    "pl_digits_mlp": Healthy(P, "lightning_run", "digits MLP, Adam 1e-3, 20 epochs",
                             dict(epochs=20)),
    "pl_cnn_cosine": Healthy(P, "lightning_run", "CNN, Adam 3e-3 cosine to zero, 12 epochs",
                             dict(body="cnn", lr=3e-3, schedule="cosine", epochs=12)),
    "pl_mlp_onecycle": Healthy(P, "lightning_run", "MLP, OneCycleLR to 1e-2, 12 epochs",
                               dict(lr=1e-2, schedule="onecycle", epochs=12)),
    "pl_preln_lm": Healthy(P, "lightning_run", "pre-LN GPT (width 64), Adam 3e-3, 300 steps",
                           dict(lm=True, lr=3e-3)),
}

#: The runs ``make test`` trains (tests/diagnose/test_findings_healthy.py): three that warned
#: before the rules were fixed: dead units and zero gradients, initialisation and oscillation,
#: output-logit drift.
IN_TESTS = ("t_three_epochs", "t_postln_lm", "t_cnn_restarts")


def train_healthy(name: str, logdir: str, **override: Any) -> Outcome:
    """Train ``CORPUS[name]`` into ``logdir``; what it showed live and at its end."""
    import time

    from tb_introspect.diagnose import find_issues
    from tb_introspect.read import read_logdir

    h = CORPUS[name]
    out = Outcome(name)
    live = Live(logdir, out)
    t0 = time.perf_counter()
    out.end = globals()[h.train](logdir, live, **{**h.kw, **override})
    out.seconds = time.perf_counter() - t0
    runs = read_logdir(logdir)
    out.final = [f for run in runs.values() for f in find_issues(run)]
    return out


def train_all(names: list[str] | None = None,
              report: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    import tempfile

    outs = []
    for name in names or list(CORPUS):
        with tempfile.TemporaryDirectory() as d:
            o = train_healthy(name, d)
        outs.append(o)
        if report is not None:
            report(o)
    return outs
