"""Which calls of a module the forward hooks read: each training call once, an activation
checkpoint's recompute during backward not a second time.

``torch.utils.checkpoint`` runs a block's forward again in backward to remake what it did
not keep, and every forward hook fires again there. Non-reentrant checkpointing (HF's
``gradient_checkpointing_enable``, FSDP2's ``checkpoint_wrapper``) runs the first pass with
autograd on: that pass is read, the recompute is not. Reentrant checkpointing runs the first
pass under ``no_grad``, which no hook reads (an evaluation pass looks the same): there the
recompute is the only pass with autograd on, so it is read, and its outputs are the ones
whose gradients backward computes."""

from __future__ import annotations

import torch
from torch import nn


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


class ForwardPasses:
    """The modules read in the current step's forward passes (outside backward), and
    whether a hook ever ran inside a ``torch.compile`` graph (``compiled``)."""

    def __init__(self) -> None:
        self._read: set[int] = set()
        self.compiled = False

    def new_step(self) -> None:
        self._read.clear()

    def reads(self, module: nn.Module) -> bool:
        """Whether this call of ``module`` is read: autograd on, and not the recompute of a
        call already read in this step. Several hooks of one call get one answer."""
        if not torch.is_grad_enabled():
            return False
        if torch.compiler.is_compiling():
            self.compiled = True
            return True  # a compiled checkpoint recomputes inside its graph, no hooks
        if not in_backward():
            self._read.add(id(module))
            return True
        return id(module) not in self._read
