"""What a PyTorch training loss is, as the user declares it (``Introspector(criterion=...)``).

The findings need to know whether the loss is a cross-entropy, whether it applies the
softmax itself (``from_logits``) and its label smoothing (docs/findings.md, ``loss_floor``).
A loop computes its loss itself, so the Introspector is told: the criterion module, or a
dict for a functional loss. Never guessed from names.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from tb_introspect import loss_field
from tb_introspect.torch import modules

#: Criterion classes: (task, from_logits). ``NLLLoss`` takes log-probabilities, ``BCELoss``
#: probabilities; ``CrossEntropyLoss`` and ``BCEWithLogitsLoss`` apply the softmax/sigmoid.
_KNOWN: tuple[tuple[type, str, bool | None], ...] = (
    (nn.CrossEntropyLoss, "classification", True),
    (nn.BCEWithLogitsLoss, "classification", True),
    (nn.NLLLoss, "classification", False),
    (nn.BCELoss, "classification", False),
    (nn.MSELoss, "regression", None),
    (nn.L1Loss, "regression", None),
    (nn.SmoothL1Loss, "regression", None),
    (nn.HuberLoss, "regression", None),
)


def describe(criterion: Any) -> str:
    """``loss_field.loss_json`` of ``criterion``: None (not known: ""), a loss module, or a
    dict with ``task`` ("classification" or "regression") and optionally ``from_logits``
    and ``label_smoothing``. ``TypeError``/``ValueError`` on anything else."""
    if criterion is None:
        return ""
    if isinstance(criterion, dict):
        unknown = sorted(set(criterion) - {"task", "from_logits", "label_smoothing"})
        if unknown or "task" not in criterion:
            raise ValueError("criterion as a dict takes 'task' and optionally 'from_logits'"
                             f" and 'label_smoothing', got {sorted(criterion)}")
        return loss_field.loss_json(criterion["task"],
                                  from_logits=criterion.get("from_logits"),
                                  label_smoothing=criterion.get("label_smoothing", 0.0),
                                  name="declared")
    if not isinstance(criterion, nn.Module):
        raise TypeError("criterion must be a loss module (nn.CrossEntropyLoss(), ...), a dict"
                        f" or None, got {type(criterion).__name__}")
    for cls, task, from_logits in _KNOWN:
        if isinstance(criterion, cls):
            return loss_field.loss_json(
                task, from_logits=from_logits,
                label_smoothing=float(getattr(criterion, "label_smoothing", 0.0) or 0.0),
                name=type(criterion).__name__)
    return ""


def describe_run(criterion: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None
                 ) -> str:
    """The loss description (``describe``) with what PyTorch knows of the configuration:
    ``untrained``, the parameters with ``requires_grad`` in no optimizer group
    (``modules.untrained_parameters``), and ``output_module``, the type of the module that
    makes the output (``modules.final_module``). "" when nothing is known."""
    text = describe(criterion)
    facts = {"untrained": modules.untrained_parameters(model, optimizer),
             "output_module": modules.final_module(model)}
    if not any(facts.values()):
        return text
    d = json.loads(text or loss_field.loss_json(None))
    d.update(facts)
    return json.dumps(d)


def attribute_loss(module: nn.Module) -> nn.Module | None:
    """The loss module ``module`` holds as an attribute (a direct child such as
    ``self.loss_fn = nn.CrossEntropyLoss()``) when it holds exactly one of the known
    classes; None when it holds none or several (which one is used is not known)."""
    found = [m for m in module.children() if isinstance(m, tuple(c for c, _, _ in _KNOWN))]
    return found[0] if len(found) == 1 else None
