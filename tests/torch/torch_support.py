"""Shared pieces of the PyTorch tests: small real models, a reference recorder that copies
every layer output and output gradient to numpy, a training loop, and the checks of a
written vector against ``stats_np``."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tb_introspect import slots, stats_np
from tb_introspect.read import provider

#: Slots that are exact (counts, moments, extremes, rates): compared with a float tolerance.
EXACT = ("count", "finite_count", "nan_count", "posinf_count", "neginf_count", "zero_fraction",
         "sign_balance", "mean", "std", "rms", "l2", "min", "max", "activation_rate",
         "dead_rate", "spatial_dead_rate")
#: Slots filled from the activity counts of every step for rectifier outputs.
ACTIVITY = ("zero_fraction", "activation_rate", "dead_rate", "spatial_dead_rate")


def small_cnn(inplace: bool = False) -> nn.Sequential:
    """conv-BN-ReLU-pool, conv-ReLU, flatten, dense-ReLU, dense: every kind of output."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=inplace),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=inplace),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(inplace=inplace), nn.Linear(16, 5),
    )


def batches(steps: int, batch: int = 16, seed: int = 0, shape=(3, 8, 8), classes: int = 5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, *shape, generator=g), torch.randint(0, classes, (batch,),
                                                                    generator=g))
            for _ in range(steps)]


class Recorder:
    """The reference: every training step's layer outputs and output gradients (numpy,
    channels last) and every optimizer step's gradients, by hooks of its own."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.outputs: list[dict[str, list[np.ndarray]]] = [{}]
        self.out_grads: list[dict[str, list[np.ndarray]]] = [{}]
        self.grads: list[dict[str, np.ndarray]] = []
        self.weights: list[dict[str, np.ndarray]] = [self._weights()]
        self.handles = []
        for name, m in model.named_modules():
            if next(m.children(), None) is None:
                self.handles.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(module, inputs, out):
            if not (torch.is_grad_enabled() and self.model.training):
                return
            self.outputs[-1].setdefault(name, []).append(_channels_last(out))
            if out.requires_grad:
                out.register_hook(lambda g: self.out_grads[-1].setdefault(name, []).append(
                    _channels_last(g)))
        return hook

    def _weights(self):
        return {n: p.detach().float().numpy().copy() for n, p in self.model.named_parameters()}

    def end_step(self):
        """After optimizer.step (before the next zero_grad)."""
        self.grads.append({n: p.grad.detach().float().numpy().copy()
                           for n, p in self.model.named_parameters() if p.grad is not None})
        self.weights.append(self._weights())
        self.outputs.append({})
        self.out_grads.append({})

    def close(self):
        for h in self.handles:
            h.remove()


def _channels_last(t: torch.Tensor) -> np.ndarray:
    a = t.detach().float().numpy().copy()
    return np.moveaxis(a, 1, -1) if a.ndim >= 3 else a


def train(model, opt, data, intro=None, recorder=None, epochs: int = 1, loss_fn=None,
          end_epoch_kwargs=None):
    loss_fn = loss_fn or nn.functional.cross_entropy
    for _ in range(epochs):
        for x, y in data:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if recorder is not None:
                recorder.end_step()
            if intro is not None:
                intro.step(loss=loss)
        if intro is not None:
            intro.end_epoch(**(end_epoch_kwargs or {}))


def read_run(log_dir: str):
    runs = provider.read_logdir(log_dir)
    assert len(runs) == 1, runs.keys()
    return next(iter(runs.values()))


def by_name(run, view: str) -> dict:
    return {s.info.name: s for s in run.tensors[view]}


def point(series, step: int) -> dict[str, float]:
    i = list(series.steps).index(step)
    return dict(zip(series.info.fields, series.values[i], strict=True))


def rank_error(data: np.ndarray, value: float, q: float) -> float:
    """How far (percentile points) ``value`` is from the ``q``-th percentile of ``data``:
    0 when it lies between the exact ``q``-th order statistics' ranks."""
    lo = 100.0 * np.mean(data < value)
    hi = 100.0 * np.mean(data <= value)
    return max(0.0, lo - q, q - hi)


def check_vector(got: dict, ref_stats: np.ndarray, ref_activity: np.ndarray | None,
                 view: str, *, exact_percentiles: bool = False, rtol: float = 2e-5,
                 rank_tol: float | None = None) -> None:
    """``got`` (a written point) against ``stats_np`` of ``ref_stats`` (the statistics
    steps' values); the activity slots against ``ref_activity`` (every step's values) when
    given; percentiles exact or within ``rank_tol`` percentile points of rank."""
    fields = slots.tensor_stats_fields(view)
    want = dict(zip(fields, stats_np.tensor_stats(ref_stats, view, sample_size=None),
                    strict=True))
    if ref_activity is not None:
        act = dict(zip(fields, stats_np.tensor_stats(ref_activity, view, sample_size=None),
                       strict=True))
        want.update({k: act[k] for k in ACTIVITY})
    for key in EXACT:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=1e-9,
                                   err_msg=f"{view} slot {key}")
    qs = slots.DEFAULT_QUANTILES
    flat = ref_stats.reshape(-1).astype(np.float64)
    flat = flat[np.isfinite(flat)]
    logs = np.log10(np.abs(flat[flat != 0]))
    for q in qs:
        vq, lq = got[slots.quantile_field(q)], got[slots.quantile_field(q, log=True)]
        if exact_percentiles:
            np.testing.assert_allclose(vq, want[slots.quantile_field(q)], rtol=1e-6,
                                       atol=1e-9, err_msg=f"{view} q{q}")
            np.testing.assert_allclose(lq, want[slots.quantile_field(q, log=True)],
                                       rtol=1e-6, atol=1e-9, err_msg=f"{view} logq{q}")
        else:
            assert rank_error(flat, vq, q) <= rank_tol, (view, q, rank_error(flat, vq, q))
            if logs.size:
                assert rank_error(logs, lq, q) <= rank_tol, (view, "log", q)


# A small pre-norm language model (attention through the fused kernel), blocks optionally
# under activation checkpointing.

VOCAB, WIDTH, HEADS, SEQ, BATCH, BLOCKS = 64, 32, 4, 12, 4, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.up, self.act, self.down = nn.Linear(WIDTH, 64), nn.ReLU(), nn.Linear(64, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(self.act(self.up(self.ln2(x))))


class LM(nn.Module):
    """``checkpointed``: None (plain), "reentrant" or "non_reentrant"."""

    def __init__(self, checkpointed: str | None) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            if self.checkpointed is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.checkpointed == "reentrant")
        return self.head(self.ln(x))


def tokens(steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(steps)]

def lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``LM`` on a batch of ``tokens``."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
