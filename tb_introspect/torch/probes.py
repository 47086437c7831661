"""The transformer probes of a PyTorch model (docs/format.md, "Version 4: probes").

On statistics steps, and only while one runs, this module hooks:

* each monitored leaf output: its batch's median |a| (from at most
  ``slots.PROBE_SAMPLE_SIZE`` values drawn without the user's RNG) and kurtosis m4 / m2²;
* the attention logits where they are made: ``torch.nn.functional``'s
  ``scaled_dot_product_attention`` (a fused kernel never materialises them, so its own
  inputs are read: a sample of query rows against every key, with its scale and mask) and
  ``multi_head_attention_forward`` (``nn.MultiheadAttention``: q and k from its in-projection).
  A call is attributed to the innermost attention module running (pre/post forward hooks);
* the output head (a Hugging Face model's ``get_output_embeddings()``, else the last
  ``Linear`` leaf, kept once its output is seen to be the model's): its largest logit and
  the mean logsumexp of its rows.

A light probe step (``follow(phase, light=True)``: the probe points of a paced run,
docs/options.md) hooks the attention modules and the head only, not the layer outputs:
``take(light=True)`` then reads and resets those rows' columns (``LIGHT_FIELDS``) and leaves
the layer outputs' to the next logged point.

Each value stays on the device (a few device scalars per row, no host sync), folded into the
window state of the probes' contract (``pipeline/probe_window.py``: a sum and a count per
mean, a running maximum per maximum); a logged point copies it to the host once (``take``),
joins the point's one exchange between ranks, and the writing rank reduces every rank's
state with ``probe_window.combine`` (``values``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from tb_introspect import slots
from tb_introspect.pipeline import probe_window
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.governor import Phase
from tb_introspect.pipeline.plan import Plan, sanitize
from tb_introspect.torch import modules
from tb_introspect.torch.attention_kernels import KERNELS
from tb_introspect.torch.modules import OutputSpec
from tb_introspect.torch.outputs import OutputStates
from tb_introspect.torch.passes import ForwardPasses
from tb_introspect.torch.probe_values import abs_median, logit_peak, mha_logit_peak
from tb_introspect.torch.ranks import host_copy
from tb_introspect.torch.state import deviation_kurtosis, hash_uniform, scratch

_WIDTH = probe_window.WIDTH
PROBES = Part("probes")
#: What a light probe step reads (the attention modules' and the head's probes); the layer
#: outputs' ``abs_median`` and ``kurtosis`` need a statistics step's output hooks.
LIGHT_FIELDS = ("attn_logit_max", "logit_max", "logit_lse")
#: The state's columns of ``LIGHT_FIELDS`` (a mean's sum and count, a maximum's peak).
LIGHT_COLUMNS = sorted(c for f in LIGHT_FIELDS for c in (
    (probe_window.SUM[f], probe_window.COUNT[f]) if f in probe_window.SUM
    else (probe_window.PEAK[f],)))


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors a model returned, one level deep (a tensor, tuple, list or mapping)."""
    if isinstance(output, torch.Tensor):
        return [output]
    items = output.values() if hasattr(output, "values") else (
        output if isinstance(output, (tuple, list)) else ())
    return [t for t in items if isinstance(t, torch.Tensor)]


class Probes:
    """The probes of one model: their rows, hooks and patches, and the window's state on
    the device (``probe_window``'s layout). ``follow(phase)`` turns the hooks on for
    statistics steps (and ``light`` ones: the attention modules' and the head's only);
    ``take()`` copies the state to the host and starts the window again (``light``: of
    ``LIGHT_FIELDS`` only), ``values(states)`` makes a point's ``Point.probes`` of every
    rank's copy."""

    def __init__(self, model: nn.Module, parts: modules.Parts, outputs: Sequence[OutputSpec],
                 plan: Plan, device: torch.device, passes: ForwardPasses, *,
                 regression: bool = False, folds: OutputStates | None = None) -> None:
        self.model = model
        self.passes = passes
        self.failures = plan.failures
        self.device = device
        head = None if regression else parts.head
        attention = parts.attention
        self.on = plan.options.probes and bool(attention or head)
        self.rows: dict[str, int] = {}
        self._outputs = [(self._row(s.name), s.module, s.name) for s in outputs] \
            if self.on else []
        # The outputs' statistics folds: while the layer hooks are on, they also take the
        # kurtosis where they have the deviations at hand (``OutputStates.kurtosis``), and
        # the probe takes no passes of its own for it.
        self.folds = folds
        by_module = {id(s.module): s.name for s in outputs}
        self._attention = {id(m): (self._row(sanitize(n)), m) for n, m in attention} \
            if self.on else {}
        self._head: tuple[int, nn.Module] | None = None
        self._head_certain = True
        if self.on and head is not None:
            name, module, self._head_certain = head
            self._head = (self._row(by_module.get(id(module), sanitize(name))), module)
        self._empty = torch.from_numpy(probe_window.empty(len(self.rows))).to(device)
        self.state = self._empty.clone()  # [rows, probe_window.WIDTH]
        self._light_columns = torch.tensor(LIGHT_COLUMNS, device=device)
        self.seen: set[int] = set()  # rows with a value since the start (host bookkeeping)
        # uniform positions in [0, 1) of the median's sample, without the user's RNG
        self.draws = hash_uniform(torch.arange(slots.PROBE_SAMPLE_SIZE, device=device),
                                   torch.zeros((), dtype=torch.int64, device=device))
        self._picks: dict[int, torch.Tensor] = {}  # output size -> the median's positions
        self._handles: list[Any] = []
        self._stack: list[int] = []  # the attention modules running, innermost last
        self._running = 0  # the model's forward passes running (another model's calls pass)
        # (slot, value, mean?): a device scalar, or a number on a CPU
        self._pending: list[tuple[int, torch.Tensor | float, bool]] = []
        self._slots: dict[tuple[int, ...], torch.Tensor] = {}
        self._head_out: torch.Tensor | None = None
        self.active = False
        self.light = False  # the hooks installed are a light step's
        #: Host seconds the probes took on light steps since ``take_spent`` (their cost)
        self.spent = 0.0
        self.compiled_off = False  # off as the model runs under torch.compile

    @property
    def has_attention(self) -> bool:
        """Whether there are attention modules to probe (a light step reads them and the
        head)."""
        return self.on and bool(self._attention)

    def take_spent(self) -> float:
        """The host seconds of the light steps' probes since the last call."""
        spent, self.spent = self.spent, 0.0
        return spent

    def _row(self, name: str) -> int:
        return self.rows.setdefault(name, len(self.rows))

    # ------------------------------------------------------------------ phase

    def follow(self, phase: Phase, light: bool = False) -> None:
        """The step phase changed: hooks and patches on for a statistics step, off else;
        ``light``: a probe step (the attention modules' and the head's hooks only) unless
        the phase is a statistics step."""
        if self.passes.compiled and self.on:
            # Inside a compiled graph a probe cannot run (its numbers leave the graph), and
            # hooks or a patch toggled per step would compile the graph again each time.
            self.on, self.compiled_off = False, True  # said by the Introspector
        on = self.on and not self.failures.is_off(PROBES.view)
        want = on and (phase is Phase.STATS or light)
        light = want and phase is not Phase.STATS
        if want == self.active and light == self.light:
            return
        try:
            if self.active:
                self._uninstall()
            if want:
                self._install(light)
        except Exception as e:  # never break training
            self.on = False
            self.failures.fail(PROBES, e)
            self._uninstall()
            return
        self.active = want

    def _install(self, light: bool = False) -> None:
        hook = self._handles.append
        self.light = light
        for i, module, name in () if light else self._outputs:
            hook(module.register_forward_hook(self._output_hook(i, name)))
        if self.folds is not None and not light:
            self.folds.kurtosis_of = {name for _, _, name in self._outputs}
        for i, module in self._attention.values():
            hook(module.register_forward_pre_hook(self._enter_hook(i)))
            hook(module.register_forward_hook(self._leave_hook, always_call=True))
        if self._head is not None:
            hook(self._head[1].register_forward_hook(self._head_hook))
            if not self._head_certain:
                hook(self.model.register_forward_hook(self._model_hook))
        if self._attention:
            hook(self.model.register_forward_pre_hook(self._model_enter))
            hook(self.model.register_forward_hook(self._model_leave, always_call=True))
            KERNELS.add(self)

    def _uninstall(self) -> None:
        self.settle()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()
        self._running = 0
        self._head_out = None
        if self.folds is not None:
            self.folds.kurtosis_of = set()
            self.folds.kurtosis.clear()
        KERNELS.remove(self)
        self.active = self.light = False

    def _training(self) -> bool:
        if torch.compiler.is_compiling():
            self.passes.compiled = True
            return False
        return torch.is_grad_enabled() and self.model.training

    # ------------------------------------------------------------------ folds

    def _mean(self, i: int, field: str, value: torch.Tensor | float) -> None:
        self._pending.append((i * _WIDTH + probe_window.SUM[field], value, True))
        self.seen.add(i)

    def _peak(self, i: int, field: str, value: torch.Tensor) -> None:
        self._pending.append((i * _WIDTH + probe_window.PEAK[field], value, False))
        self.seen.add(i)

    def settle(self) -> None:
        """Fold the values of the statistics steps so far (device scalars) into the window's
        state, as ``probe_window.fold`` does: a few ops for all of them, not a few per
        value. A non-finite value is left out of a mean; a maximum keeps +inf, and a NaN
        makes it NaN. An error switches the probes off (training goes on)."""
        pending, self._pending = self._pending, []
        try:
            self._fold(pending)
        except Exception as e:  # never break training
            self.on = False
            self.failures.fail(PROBES, e)

    def _fold(self, pending: list[tuple[int, torch.Tensor | float, bool]]) -> None:
        for mean in (True, False):
            chosen = [(j, v) for j, v, m in pending if m is mean]
            if not chosen:
                continue
            slots = tuple(j for j, _ in chosen)
            at = self._slots.get(slots)
            if at is None:  # a step's slots repeat: copied to the device once
                if len(self._slots) > 64:
                    self._slots.clear()
                at = self._slots[slots] = torch.tensor(slots, device=self.device)
            if self.device.type == "cpu":  # reading a CPU scalar waits for nothing
                v = torch.tensor([float(v) for _, v in chosen], dtype=torch.float64)
            else:
                v = torch.stack([v.reshape(()) for _, v in chosen]).double()
            flat = self.state.view(-1)
            if mean:  # the sum's slot, then its count's
                finite = torch.isfinite(v)
                flat.index_add_(0, at, torch.where(finite, v, 0.0))
                flat.index_add_(0, at + 1, finite.double())
            else:
                # the largest of the others, then NaN added where a NaN came (adding 0
                # leaves a maximum, ±inf too); a slot already NaN stays NaN
                nan = torch.isnan(v)
                was_nan = torch.isnan(flat)
                flat.scatter_reduce_(0, at, torch.where(nan, -math.inf, v), reduce="amax")
                flat.index_add_(0, at, torch.where(nan, v, 0.0))
                flat.masked_fill_(was_nan, math.nan)

    def _guarded(self, fn: Callable, *args: Any) -> None:
        if not self.active:
            return
        start = time.perf_counter() if self.light else None
        try:
            with torch.no_grad():
                fn(*args)
                if len(self._pending) > 4096:  # statistics steps one after the other
                    self.settle()
        except Exception as e:  # never break training
            self.failures.fail(PROBES, e)
            self._uninstall()
        if start is not None:
            self.spent += time.perf_counter() - start

    def _output_hook(self, i: int, name: str) -> Callable:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            x = modules.first_tensor(output)
            folded = None if self.folds is None else self.folds.kurtosis.pop(name, None)
            if (x is not None and x.is_floating_point() and x.numel() and self._training()
                    and self.passes.reads(module)):
                kurtosis = folded[1] if folded is not None and folded[0] is x else None
                self._guarded(self._layer, i, x.detach(), kurtosis)
        return hook

    def _layer(self, i: int, x: torch.Tensor, kurtosis: float | None = None) -> None:
        flat = (x if x.dtype == torch.float64 else x.float()).reshape(-1)
        n = flat.numel()
        # The same uniform positions at every step (the batches differ): no draw to pay,
        # and the positions of each size made once.
        sample = flat
        if n > len(self.draws):
            pick = self._picks.get(n)
            if pick is None:
                if len(self._picks) > 256:
                    self._picks.clear()
                pick = self._picks[n] = (self.draws * n).long()
            sample = flat.index_select(0, pick)
        d = scratch(flat, n, 1)[0]
        if flat.device.type == "cpu":  # numbers on the host: a few numpy calls, not kernels
            self._mean(i, "abs_median", probe_window.abs_median(sample.numpy()))
            if kurtosis is not None:  # the statistics fold's (``folded``)
                self._mean(i, "kurtosis", kurtosis)
                return
            torch.sub(flat, float(flat.sum()) / n, out=d)
            self._mean(i, "kurtosis", deviation_kurtosis(d))
            return
        self._mean(i, "abs_median", abs_median(sample))  # by selection, on the device
        # kurtosis: two passes from the mean, the sums of powers as dot products (fused); the
        # deviations in the CPU's reused work buffer (a fresh one costs its page faults)
        torch.sub(flat, flat.mean(), out=d)
        m2 = torch.dot(d, d) / n
        d.square_()
        self._mean(i, "kurtosis", torch.dot(d, d) / n / (m2 * m2))

    def _head_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        x = modules.first_tensor(output)
        if (x is None or not x.is_floating_point() or not x.numel() or not self._training()
                or not self.passes.reads(module)):
            return
        if not self._head_certain:
            self._head_out = x
        self._guarded(self._logits, self._head[0], x.detach())

    def _logits(self, i: int, x: torch.Tensor) -> None:
        x = x if x.dtype == torch.float64 else x.float()
        self._peak(i, "logit_max", x.amax())
        rows = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1)
        self._mean(i, "logit_lse", torch.logsumexp(rows, dim=-1).mean())

    def _model_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        """The first training forward pass tells whether the head candidate's output is the
        model's; if not, there is no head (and no probes at all without attention)."""
        if not self._training() or self._head is None:
            return
        made, self._head_out = self._head_out, None
        if made is not None:
            try:
                self._decide_head(made, output)
            except Exception as e:  # never break training
                self.on = False
                self.failures.fail(PROBES, e)
                self._uninstall()

    def _decide_head(self, made: torch.Tensor, output: Any) -> None:
        if not any(t is made for t in _tensors(output)):
            self.settle()
            i = self._head[0]
            # the candidate's values are no head's
            self.state[i, probe_window.PEAK["logit_max"]] = -math.inf
            self.state[i, probe_window.SUM["logit_lse"]] = 0.0
            self.state[i, probe_window.COUNT["logit_lse"]] = 0.0
            if all(j != i for j, _, _ in self._outputs):
                self.seen.discard(i)  # no layer output's row either
            self._head = None
            if not self._attention:
                self.on = False
                self.seen.clear()
        self._head_certain = True
        light = self.light
        self._uninstall()  # again without the model's hook (or without any)
        if self.on:
            self._install(light)
            self.active = True

    def _enter_hook(self, i: int) -> Callable:
        def hook(module: nn.Module, inputs: Any) -> None:
            # a call not read (a checkpoint's recompute): its kernel calls pass (-1)
            self._stack.append(i if self.passes.reads(module) else -1)
        return hook

    def _leave_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _model_enter(self, module: nn.Module, inputs: Any) -> None:
        self._running += 1

    def _model_leave(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self._running = max(0, self._running - 1)

    def _attention_row(self) -> int | None:
        if self._stack:
            return self._stack[-1] if self._stack[-1] >= 0 else None
        if self._running and self._training():
            self.failures.warn_once("probes sdpa", "probes: an attention call outside any"
                                    " module recognised as attention (nn.MultiheadAttention,"
                                    " a class named *Attention*) is not probed")
        return None

    def sdpa_call(self, args: tuple, kwargs: dict) -> None:
        """A ``scaled_dot_product_attention`` call (``KERNELS``): probed when this model's
        attention module runs it."""
        if self.active and self._training():
            i = self._attention_row()
            if i is not None:
                self._guarded(self._sdpa_logits, i, args, kwargs)

    def mha_call(self, arguments: dict) -> None:
        """A ``multi_head_attention_forward`` call that makes the weights itself."""
        if self.active and self._training():
            i = self._attention_row()
            if i is not None:
                self._guarded(self._mha_logits, i, arguments)

    def _sdpa_logits(self, i: int, args: tuple, kwargs: dict) -> None:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                 "enable_gqa")
        a = {**dict(zip(names, args, strict=False)), **kwargs}
        q, k = a["query"].detach(), a["key"].detach()
        if a.get("enable_gqa") and q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        mask = a.get("attn_mask")
        self._peak(i, "attn_logit_max", logit_peak(q, k, () if mask is None else (mask.detach(),),
                                        is_causal=bool(a.get("is_causal")),
                                        scale=a.get("scale")))

    def _mha_logits(self, i: int, arguments: dict) -> None:
        self._peak(i, "attn_logit_max", mha_logit_peak(**arguments))

    # ------------------------------------------------------------------ a point

    def take(self, light: bool = False) -> tuple[np.ndarray, list[str]]:
        """This rank's window state, ``[rows, probe_window.WIDTH]`` (one host copy; the same
        shape on every rank: it joins the point's exchange between ranks), and the rows
        this rank has seen a value of so far. The window starts again; ``light`` (a probe
        point): of ``LIGHT_FIELDS`` only, the others left in the state for the next logged
        point (and empty in the copy: NaN at the probe point)."""
        self.settle()
        copy = host_copy(self.state)
        if light:
            cols = self._light_columns
            self.state.index_copy_(1, cols, self._empty.index_select(1, cols))
            others = np.setdiff1d(np.arange(_WIDTH), LIGHT_COLUMNS)
            copy[:, others] = probe_window.empty(len(self.rows))[:, others]
        else:
            self.state.copy_(self._empty)
        names = {i: name for name, i in self.rows.items()}
        return copy, [names[i] for i in sorted(self.seen)]

    def empty_state(self) -> np.ndarray:
        """A window with no value: this rank's part of the exchange when ``take`` gave none."""
        return probe_window.empty(len(self.rows))

    def values(self, states: np.ndarray, seen: list[str]) -> dict[str, np.ndarray]:
        """A point's probes from every rank's ``take`` (``[ranks, rows * WIDTH]``; ``seen``:
        the writing rank's rows): row name -> ``PROBE_VALUE_FIELDS`` (NaN where one does
        not apply), by ``probe_window.combine``. Runs beside training: host copies only."""
        if not seen:
            return {}
        names = sorted(self.rows, key=self.rows.__getitem__)
        point = probe_window.combine(np.reshape(states, (-1, len(names), _WIDTH)), names)
        return {name: point[name] for name in seen}

    def close(self) -> None:
        """Remove every hook and patch."""
        self._uninstall()
        self.on = False
