"""The attention functions of ``torch.nn.functional`` (``scaled_dot_product_attention``,
``multi_head_attention_forward``), patched while any ``probes.Probes`` probes attention:
each call is offered to the probes on (``KERNELS``), the user's call runs once, as it is."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol

import torch.nn.functional as F


class Listener(Protocol):
    """What a call is offered to (``probes.Probes``)."""

    def sdpa_call(self, args: tuple, kwargs: dict) -> None: ...

    def mha_call(self, arguments: dict) -> None: ...


class Kernels:
    """The two attention functions of ``torch.nn.functional``, patched while any ``Probes``
    is on a statistics step (one patch for every ``Introspector`` of the process, each call
    offered to each) and given back when none is. The user's call runs once, as it is."""

    NAMES = ("scaled_dot_product_attention", "multi_head_attention_forward")

    def __init__(self) -> None:
        self.users: list[Listener] = []
        self.patched: dict[str, tuple[Callable, Callable]] = {}  # name -> (original, ours)
        # ours of each original, made once: under torch.compile a graph guards on the
        # function's identity, so a new wrapper at each statistics step would recompile
        self._made: dict[str, tuple[Callable, Callable]] = {}

    def add(self, probes: Listener) -> None:
        if not self.users:
            for name, make in zip(self.NAMES, (self._sdpa, self._mha), strict=True):
                original = getattr(F, name)
                made = self._made.get(name)
                if made is None or made[0] is not original:
                    made = self._made[name] = (
                        original, functools.wraps(original)(make(original)))
                self.patched[name] = made
                setattr(F, name, made[1])
        if probes not in self.users:
            self.users.append(probes)

    def remove(self, probes: Listener) -> None:
        if probes in self.users:
            self.users.remove(probes)
        if not self.users:
            for name, (original, ours) in self.patched.items():
                if getattr(F, name) is ours:  # another tool's patch on top stays
                    setattr(F, name, original)
            self.patched.clear()

    def _sdpa(self, original: Callable) -> Callable:
        def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            for probes in tuple(self.users):
                probes.sdpa_call(args, kwargs)
            return out
        return scaled_dot_product_attention

    def _mha(self, original: Callable) -> Callable:
        signature = inspect.signature(original)

        def multi_head_attention_forward(*args: Any, **kwargs: Any) -> Any:
            # Without weights it calls the fused kernel, whose own q and k are read there.
            try:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                weights = bool(bound.arguments.get("need_weights"))
            except TypeError:  # the function's own error follows
                weights = False
            if weights:
                for probes in tuple(self.users):
                    probes.mha_call(bound.arguments)
            return original(*args, **kwargs)
        return multi_head_attention_forward


KERNELS = Kernels()
