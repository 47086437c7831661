"""What is monitored in a PyTorch model: its leaf modules (layer outputs) and trainable
parameters, named and ordered the way the format expects (``docs/format.md``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from tb_introspect.pipeline.plan import Monitored, sanitize
from tb_introspect.torch import private
from tb_introspect.torch.state import Segment

#: Modules whose rank >= 3 outputs keep the features on the last axis (sequences); every
#: other module's rank >= 3 output is read as PyTorch's ``(batch, C, *spatial)``.
CHANNELS_LAST = (nn.Linear, nn.Bilinear, nn.Embedding, nn.LayerNorm, nn.MultiheadAttention,
                 nn.RMSNorm)

#: The layer name of a model's own parameters and of a model without submodules.
ROOT = "model"


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside ``DistributedDataParallel`` / ``DataParallel`` and
    ``torch.compile``'s wrapper (hooks go on the modules that really run)."""
    for _ in range(4):
        inner = private.compiled_inner(model) or (
            model.module if isinstance(model, (nn.parallel.DistributedDataParallel,
                                               nn.DataParallel)) else None)
        if inner is None:
            return model
        model = inner
    return model


@dataclass(kw_only=True)
class OutputSpec(Monitored):
    """One monitored layer output: a leaf module, called once or more per forward pass
    (its shape and dtype are the first call's)."""

    module: nn.Module
    channels_first: bool
    segments: dict[str, Segment] = field(default_factory=dict)


@dataclass(kw_only=True)
class ParamSpec(Monitored):
    """One trainable parameter (variable and gradient views)."""

    param: torch.nn.Parameter
    offset: int = 0

    @property
    def size(self) -> int:
        return self.param.numel()


def layer_order(model: nn.Module) -> dict[str, int]:
    """Depth of every leaf module and parameter-holding module: its position in
    ``named_modules`` order (the order the model's constructor defines, which for a
    sequential network is the forward order)."""
    order: dict[str, int] = {}
    for name, m in model.named_modules():
        leaf = next(m.children(), None) is None
        if leaf or any(True for _ in m.parameters(recurse=False)):
            order.setdefault(name or ROOT, len(order))
    return order


def is_rectifier(module: nn.Module) -> bool:
    """Whether ``module``'s own function makes exact zeros on a whole half-line (ReLU,
    ReLU6, a LeakyReLU without slope, a Threshold to 0, a module whose ``activation`` is
    one of these): only there does a unit that is
    zero for every sample mean something (a dead unit), so only there is the activity
    counted on every step (the Keras side's rule)."""
    if isinstance(module, (nn.ReLU, nn.ReLU6)):
        return True
    if isinstance(module, nn.LeakyReLU):
        return float(module.negative_slope) == 0.0
    if isinstance(module, nn.Threshold):
        return float(module.value) == 0.0
    # A layer with its activation inside, Keras style: ``self.activation = "relu"``
    # (or torch.relu, F.relu, an nn.ReLU module).
    act = getattr(module, "activation", None)
    if isinstance(act, str):
        return act in ("relu", "relu6")
    if isinstance(act, nn.Module):
        return is_rectifier(act)
    return act in (torch.relu, torch.nn.functional.relu, torch.nn.functional.relu6)


def output_specs(model: nn.Module, chosen: Callable[[str], bool] = lambda name: True,
                 rectifier: Callable[[str], bool] = lambda name: False) -> list[OutputSpec]:
    """Every leaf module that ``chosen(name)`` keeps, in module order; ``rectifier(name)``
    names more rectifiers (a custom activation module)."""
    depth = layer_order(model)
    specs = []
    for name, m in model.named_modules():
        layer = name or ROOT
        if next(m.children(), None) is None and chosen(layer):
            specs.append(OutputSpec(
                view="output", name=sanitize(layer), layer=layer, depth=depth[layer],
                module=m, channels_first=not isinstance(m, CHANNELS_LAST),
                exact=is_rectifier(m) or rectifier(layer)))
    return specs


def param_specs(model: nn.Module, chosen: Callable[[str], bool] = lambda name: True
                ) -> list[ParamSpec]:
    """Trainable parameters of the layers ``chosen(name)`` keeps, in ``named_parameters``
    order; names ``<layer>/<parameter>``."""
    depth = layer_order(model)
    specs, offset = [], 0
    for full, p in model.named_parameters():
        layer, _, short = full.rpartition(".")
        layer = layer or ROOT
        if not p.requires_grad or not chosen(layer):
            continue
        specs.append(ParamSpec(
            view="variable", name=sanitize(f"{layer}/{short}"), layer=layer,
            depth=depth.get(layer, len(depth)), shape=tuple(p.shape),
            dtype=str(p.dtype).replace("torch.", ""), param=p, offset=offset))
        offset += p.numel()
    return specs


def first_tensor(output) -> torch.Tensor | None:
    """The tensor a module returned, or the first tensor of a tuple/list it returned."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None
