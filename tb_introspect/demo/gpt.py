"""A small GPT-style causal language model in PyTorch, its synthetic language, and the
trainings that go unstable the way large Transformers do.

Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") reproduce two instabilities in small models by raising the learning rate:
the attention logits q.k/sqrt(d) grow without bound unless the queries and keys are
layer-normalised (QK-layernorm), and the output logits drift. ``GPT`` has pre-LN blocks,
an optional QK-layernorm (``qk_norm=True``), and an LM head; ``STORIES`` names the runs
the findings are validated on: the unstable one and its two stable twins (QK-layernorm at
the same rate, and a low rate).

The data is a fixed random Markov chain over a small vocabulary (``markov_tokens``, each
token has ``BRANCHING`` possible successors): a healthy run's loss falls from log(32) = 3.47
to near the chain's entropy (0.78) within a hundred steps, so a divergence after it is plain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VOCAB, SEQ = 32, 32
#: Successors each context allows (the chain's branching).
BRANCHING = 3
#: The language's own seed: every run of every seed learns the same chain.
LANGUAGE_SEED = 1234
#: Tokens the next one depends on: 1 is learnt within a hundred steps, before the high
#: rate's warm-up ends (an order-2 chain sits on a plateau for longer than that).
ORDER = 1


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape; ``qk_norm`` layer-normalises each head's queries and keys."""

    vocab: int = VOCAB
    seq: int = SEQ
    width: int = 128
    heads: int = 2
    layers: int = 2
    qk_norm: bool = False


def _transitions(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The chain: for each context (a, b), ``BRANCHING`` successors and their probabilities."""
    rng = np.random.default_rng(LANGUAGE_SEED)
    ctx = (vocab,) * ORDER
    succ = rng.integers(0, vocab, size=(*ctx, BRANCHING))
    prob = rng.dirichlet(np.ones(BRANCHING), size=ctx)
    return succ, prob


def markov_tokens(n: int, seq: int = SEQ, vocab: int = VOCAB, *, seed: int = 0) -> torch.Tensor:
    """``n`` sequences of ``seq + 1`` tokens of the chain (inputs and shifted targets)."""
    return torch.from_numpy(chain(n, seq, vocab, seed=seed))


def chain(n: int, seq: int = SEQ, vocab: int = VOCAB, *, seed: int = 0) -> np.ndarray:
    """``markov_tokens`` as an int64 numpy array (the Keras trainings' data)."""
    succ, prob = _transitions(vocab)
    rng = np.random.default_rng(seed)
    x = np.empty((n, seq + 1), np.int64)
    x[:, :ORDER] = rng.integers(0, vocab, size=(n, ORDER))
    cum = np.cumsum(prob, axis=-1)
    for t in range(ORDER, seq + 1):
        ctx = tuple(x[:, t - ORDER + i] for i in range(ORDER))
        choice = (rng.random(n)[:, None] > cum[ctx]).sum(-1).clip(max=BRANCHING - 1)
        x[:, t] = succ[(*ctx, choice)]
    return x


def entropy_floor(vocab: int = VOCAB) -> float:
    """The chain's mean conditional entropy (nats): the loss a perfect model reaches."""
    _, prob = _transitions(vocab)
    return float(np.mean(-np.sum(prob * np.log(prob), axis=-1)))


class Attention(nn.Module):
    """Causal multi-head self-attention through ``scaled_dot_product_attention``.

    With ``qk_norm`` each head's queries and keys go through a LayerNorm before the dot
    product (Wortsman et al.'s QK-layernorm), which bounds the logits. ``track_logits``
    makes each forward also record ``logit_max``, the largest |q.k/sqrt(d)| over heads
    and causal positions: the experiments' direct measurement, off by default.
    """

    def __init__(self, width: int, heads: int, qk_norm: bool = False):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        # Without a learned gain: |q.k|/sqrt(d) <= sqrt(d) whatever the rate does to the
        # projections, so the twin's logits stay bounded by construction.
        self.q_norm = nn.LayerNorm(self.head_dim, elementwise_affine=False) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim, elementwise_affine=False) if qk_norm else None
        self.track_logits = False
        self.logit_max = math.nan

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.track_logits:
            with torch.no_grad():
                logits = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
                t = x.shape[1]
                causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                self.logit_max = float(logits.abs().masked_fill(~causal, 0).max())
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b, _, t, _ = y.shape
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = Attention(cfg.width, cfg.heads, cfg.qk_norm)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, pre-LN blocks, a final LayerNorm and the LM head."""

    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.seq, cfg.width)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln_f(self.blocks(self.tok(ids) + self.pos(pos))))

    def attentions(self) -> list[Attention]:
        return [b.attn for b in self.blocks]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0) -> torch.Tensor:
    """Mean next-token cross-entropy, plus ``z_loss`` x the mean squared log-partition
    (PaLM's z-loss, which keeps the output logits from drifting)."""
    flat = logits.reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(flat, targets.reshape(-1))
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(flat, -1).square().mean()
    return loss


#: Peak learning rates: the unstable one, and the low one its twin trains at. Without
#: QK-layernorm, at 0.03-0.05 the logits pass 1000 but the loss only creeps up (to ~0.95)
#: within 300 steps, at 0.1 it diverges on every seed tried; at 0.01 the logits still pass
#: 100 by step 300 (the loss intact), at 0.003 they stay below 10.
HIGH_LR, LOW_LR = 1e-1, 3e-3
#: The warm-up lets every run learn the chain (by step ~60) before the rate is high.
WARMUP = 150
STEPS = 300
BATCH = 16


@dataclass(frozen=True)
class Story:
    """One training: the model's QK-layernorm, the peak rate, and what it should do."""

    qk_norm: bool
    lr: float
    unstable: bool
    note: str
    warmup: int = WARMUP
    z_loss: float = 0.0
    weight_decay: float = 0.0


STORIES: dict[str, Story] = {
    "gpt_high_lr": Story(False, HIGH_LR, True, "no QK-layernorm, AdamW at a high rate"),
    "gpt_high_lr_qk_norm": Story(True, HIGH_LR, False, "twin: QK-layernorm at the same rate"),
    "gpt_low_lr": Story(False, LOW_LR, False, "twin: a 30x lower rate"),
}


def optimizer(model: nn.Module, lr: float, warmup: int = WARMUP,
              weight_decay: float = 0.0) -> tuple[torch.optim.Optimizer, object]:
    """AdamW (betas 0.9, 0.95) with a linear warm-up to ``lr`` over ``warmup`` steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                            weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    return opt, sched


def batches(seed: int, batch: int = BATCH, seq: int = SEQ,
            vocab: int = VOCAB) -> Iterator[torch.Tensor]:
    """An endless stream of fresh chain batches, ``[batch, seq + 1]``."""
    i = 0
    while True:
        yield markov_tokens(batch, seq, vocab, seed=seed * 1_000_003 + i)
        i += 1


def smoothed(losses: np.ndarray, window: int = 10) -> np.ndarray:
    """The mean of each step's last ``window`` losses (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(losses)])
    n = np.arange(1, len(losses) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def diverged_at(losses: np.ndarray, learned: float | None = None, *, rise: float = 1.5,
                window: int = 10) -> int | None:
    """The step (1-based) the loss diverged: the first non-finite loss, or the first step
    whose ``window``-step mean loss exceeds ``rise`` x its running minimum once that minimum
    is at or below ``learned`` (the model has learned the language: by default within 25 %
    of the chain's entropy). None if never. The mean and the "learned" condition keep a
    batch's noise and the early plateaus of the warm-up from counting as a divergence."""
    learned = 1.25 * entropy_floor() if learned is None else learned
    bad = ~np.isfinite(losses)
    if bad.any():
        first_bad = int(np.argmax(bad)) + 1
        losses = losses[:first_bad - 1]
    else:
        first_bad = None
    best = math.inf
    for i, value in enumerate(smoothed(losses, window)):
        if best <= learned and value > rise * best:
            return i + 1
        best = min(best, value)
    return first_bad


@dataclass
class History:
    """A training's per-step loss and largest attention logit (over its layers), and the
    findings its ``on_finding`` saw while it ran: (the step it was at, the kind)."""

    losses: np.ndarray
    logit_max: np.ndarray
    live: list[tuple[int, str]] = field(default_factory=list)

    @property
    def diverged(self) -> int | None:
        return diverged_at(self.losses)


#: Steps per logged point of the logged runs (``window=``): 20 points in a run.
WINDOW = 15


def train(story: Story, *, seed: int = 0, steps: int = STEPS, cfg: GPTConfig | None = None,
          track_logits: bool = True, log_dir: str | None = None,
          **options: object) -> History:
    """Train ``story`` for ``steps`` steps of fresh chain batches, one epoch.

    With ``log_dir`` a ``tb_introspect.torch.Introspector`` follows the loop (a point every
    ``WINDOW`` steps unless ``options`` say otherwise; ``options``: its keywords), and each
    finding the rules judge while it runs is kept in ``History.live``."""
    torch.manual_seed(seed)
    cfg = cfg or GPTConfig(qk_norm=story.qk_norm)
    model = GPT(cfg)
    opt, sched = optimizer(model, story.lr, story.warmup, story.weight_decay)
    for a in model.attentions():
        a.track_logits = track_logits
    intro = None
    losses: list[float] = []
    logits: list[float] = []
    live: list[tuple[int, str]] = []
    if log_dir is not None:
        from tb_introspect.torch import Introspector

        intro = Introspector(log_dir, model, opt, **{
            "every": "epoch", "window": WINDOW, "criterion": nn.CrossEntropyLoss(),
            "on_finding": lambda f: live.append((len(losses), f.kind)), **options})
    data = batches(seed, seq=cfg.seq, vocab=cfg.vocab)
    try:
        for _ in range(steps):
            ids = next(data)
            loss = lm_loss(model(ids[:, :-1]), ids[:, 1:], story.z_loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            logits.append(max((a.logit_max for a in model.attentions()), default=math.nan))
            if intro is not None:
                intro.step(loss=loss)
        if intro is not None:
            intro.end_epoch()
    finally:
        if intro is not None:
            intro.close()
    return History(np.array(losses), np.array(logits), live)


# --- The same instability in a Hugging Face GPT-2 under the ``Trainer`` -------------------


class ChainStream(torch.utils.data.IterableDataset):
    """An endless stream of chain sequences of ``seq`` tokens as ``{"input_ids", "labels"}``
    (the model shifts the labels itself), seeded."""

    def __init__(self, seed: int = 0, seq: int = SEQ, vocab: int = VOCAB):
        self.seed, self.seq, self.vocab = seed, seq, vocab

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for block in batches(self.seed, batch=256, seq=self.seq - 1, vocab=self.vocab):
            for row in block:
                yield {"input_ids": row, "labels": row}


def gpt2(width: int = 128, heads: int = 2, layers: int = 2, vocab: int = VOCAB,
         seq: int = SEQ) -> nn.Module:
    """A tiny ``GPT2LMHeadModel`` from its config (no download, no dropout): GPT-2 has no
    QK-layernorm, so its stable twin is a lower rate."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq,
        bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))


def opt_post_ln(width: int = 128, heads: int = 2, layers: int = 2, vocab: int = VOCAB,
                seq: int = SEQ) -> nn.Module:
    """A tiny post-LN ``OPTForCausalLM`` from its config (``do_layer_norm_before=False``:
    each block's LayerNorm after its residual sum, as in the original Transformer and
    OPT-350m; no download, no dropout)."""
    from transformers import OPTConfig, OPTForCausalLM

    return OPTForCausalLM(OPTConfig(
        vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, ffn_dim=4 * width,
        num_attention_heads=heads, max_position_embeddings=seq, word_embed_proj_dim=width,
        do_layer_norm_before=False, dropout=0.0, attention_dropout=0.0, layerdrop=0.0,
        pad_token_id=vocab - 1, bos_token_id=0, eos_token_id=0))


def llama(width: int = 128, heads: int = 2, layers: int = 2, vocab: int = VOCAB,
          seq: int = SEQ) -> nn.Module:
    """A small stock ``LlamaForCausalLM`` from its config (pre-RMSNorm, rotary positions,
    a SwiGLU MLP; no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=4 * width,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=seq, bos_token_id=0, eos_token_id=0, pad_token_id=None,
        tie_word_embeddings=False))


def track_gpt2_logits(model: nn.Module) -> list[float]:
    """Hooks that append, per forward, the largest |q.k/sqrt(d)| over the model's GPT-2
    attention layers (causal positions) to the returned list: the direct measurement."""
    found: list[float] = []
    attns = [m for m in model.modules() if type(m).__name__ == "GPT2Attention"]
    latest: dict[int, float] = {}

    def hook(i: int, attn: nn.Module):
        def fn(_mod, _inp, qkv):
            with torch.no_grad():
                q, k, _ = qkv.split(attn.split_size, dim=2)
                b, t, _ = q.shape
                q = q.view(b, t, -1, attn.head_dim).transpose(1, 2)
                k = k.view(b, t, -1, attn.head_dim).transpose(1, 2)
                logits = (q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim)
                causal = torch.ones(t, t, dtype=torch.bool).tril()
                latest[i] = float(logits.abs().masked_fill(~causal, 0).max())
            if i == len(attns) - 1:
                found.append(max(latest.values()))
        return fn

    for i, attn in enumerate(attns):
        attn.c_attn.register_forward_hook(hook(i, attn))
    return found


#: The HF GPT-2 runs: the unstable peak rate and its 30x lower twin, the warm-up, steps.
HF_HIGH_LR, HF_LOW_LR = 1e-1, 3e-3
HF_WARMUP, HF_STEPS, HF_BATCH = 150, 300, 16


def train_hf(out: str, lr: float, *, seed: int = 0, steps: int = HF_STEPS,
             introspect: dict | None = None, track_logits: bool = True,
             model: Callable[[], nn.Module] = gpt2,
             made: Callable[[object], None] | None = None,
             **args) -> tuple[object, History]:
    """Train the tiny GPT-2 (or ``model()``: ``opt_post_ln``, ``llama``) with the
    ``Trainer`` on ``ChainStream`` for ``steps`` steps (AdamW, betas 0.9/0.95, linear
    warm-up then constant, no gradient clipping: clipping at the Trainer's default norm 1
    holds the loss near 1.0 while the attention logits still grow past 10^4); its
    TensorBoard run is ``out/runs/<date_host>``. ``introspect``: the keywords of a
    ``tb_introspect.transformers.IntrospectCallback`` to train with (``{}``: its defaults),
    whose live findings go to ``History.live``; ``made``: called with its ``Introspector``
    when training starts (the validation scales its governor's clock there). ``args``:
    more ``TrainingArguments`` (``gradient_accumulation_steps``...).
    Returns the trainer and the per-step loss and attention-logit history (the latter the
    GPT-2's only, with ``track_logits``; empty otherwise)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(seed)
    model = model()
    seen = track_gpt2_logits(model) if track_logits else []
    args = {"per_device_train_batch_size": HF_BATCH, **args}
    targs = TrainingArguments(
        out, max_steps=steps, learning_rate=lr,
        lr_scheduler_type="constant_with_warmup", warmup_steps=HF_WARMUP, adam_beta2=0.95,
        weight_decay=0.0, logging_steps=1, save_strategy="no", report_to="tensorboard",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=seed,
        **{"max_grad_norm": 0.0, **args})
    live: list[tuple[int, str]] = []
    callbacks = []
    if introspect is not None:
        from tb_introspect.transformers import IntrospectCallback

        def on_finding(f) -> None:
            live.append((trainer.state.global_step, f.kind))

        callback = IntrospectCallback(**{"on_finding": on_finding, **introspect})
        if made is not None:
            begin = callback.on_train_begin

            def on_train_begin(*a, **kw) -> None:
                begin(*a, **kw)
                made(callback.introspector)

            callback.on_train_begin = on_train_begin
        callbacks.append(callback)
    trainer = Trainer(model=model, args=targs, train_dataset=ChainStream(seed),
                      callbacks=callbacks)
    trainer.train()
    losses = np.array([r["loss"] for r in trainer.state.log_history if "loss" in r])
    return trainer, History(losses, np.array(seen[:len(losses)]), live)
