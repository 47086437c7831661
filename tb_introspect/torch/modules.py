"""What is monitored in a PyTorch model: its leaf modules (layer outputs) and trainable
parameters, named and ordered the way the format expects (``docs/format.md``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from tb_introspect.pipeline.plan import Monitored, Plan, sanitize
from tb_introspect.stats_np.segments import Segment
from tb_introspect.torch import private

#: Modules whose rank >= 3 outputs keep the features on the last axis (sequences).
CHANNELS_LAST = (nn.Linear, nn.Bilinear, nn.Embedding, nn.LayerNorm, nn.MultiheadAttention,
                 nn.RMSNorm)
#: Modules whose rank >= 3 outputs are PyTorch's ``(batch, C, *spatial)``. A module of
#: neither kind (an activation, dropout, a custom layer) is read in the layout of the leaf
#: module before it (``channels_first``).
CHANNELS_FIRST = (nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm,
                  nn.modules.instancenorm._InstanceNorm, nn.GroupNorm, nn.LocalResponseNorm,
                  nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
                  nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd,
                  nn.Upsample, nn.PixelShuffle)

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
    specs, cf = [], True
    for name, m in model.named_modules():
        layer = name or ROOT
        if next(m.children(), None) is not None:
            continue
        cf = channels_first(m, cf)
        if chosen(layer):
            specs.append(OutputSpec(
                view="output", name=sanitize(layer), layer=layer, depth=depth[layer],
                module=m, channels_first=cf, exact=is_rectifier(m) or rectifier(layer)))
    return specs


def channels_first(module: nn.Module, previous: bool) -> bool:
    """Whether ``module``'s rank >= 3 outputs are ``(batch, C, *spatial)``: known for
    convolutions, pooling and norms (channels first) and for linear, embedding and sequence
    norms (features last: also GPT-2's ``Conv1D``, a linear layer with its weight
    transposed); any other module keeps the layout of the leaf before it (``previous``):
    an activation or a dropout passes its input's layout on."""
    if isinstance(module, CHANNELS_LAST) or (type(module).__name__ == "Conv1D"
                                             and hasattr(module, "nf")):
        return False
    if isinstance(module, CHANNELS_FIRST):
        return True
    return previous


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


@dataclass
class Parts:
    """What a model has to monitor: its parameters and layer outputs (of the layers the
    plan keeps), the modules an attention call is attributed to, and the output head
    (``(name, module, certain)``, or None), whose logits the probes read."""

    params: list[ParamSpec]
    outputs: list[OutputSpec]
    attention: list[tuple[str, nn.Module]]
    head: tuple[str, nn.Module, bool] | None


def discover(model: nn.Module, plan: Plan) -> Parts:
    """A model's ``Parts``, from its module tree."""
    return Parts(param_specs(model, plan.chosen),
                 output_specs(model, plan.chosen, plan.named_rectifier),
                 attention_modules(model), find_head(model))


def find_head(model: nn.Module) -> tuple[str, nn.Module, bool] | None:
    """The output head: ``(name, module, certain)``. A Hugging Face model's
    ``get_output_embeddings()`` is certain; else the last ``Linear`` leaf in module order,
    kept once a forward pass shows its output to be the model's (``certain`` False)."""
    names = {m: n for n, m in model.named_modules()}
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
        except Exception:  # a model whose method is not implemented
            head = None
        if isinstance(head, nn.Linear) and head in names:
            return names[head] or ROOT, head, True
    last = None
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and next(m.children(), None) is None:
            last = (name or ROOT, m, False)
    return last


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules an attention call is attributed to: ``nn.MultiheadAttention`` and every
    module whose class is named as an attention layer (``GPT2Attention``,
    ``LlamaAttention``, ``BertSelfAttention``, nanoGPT's ``CausalSelfAttention``)."""
    return [(name or ROOT, m) for name, m in model.named_modules()
            if isinstance(m, nn.MultiheadAttention) or "attention" in type(m).__name__.lower()]


def first_tensor(output) -> torch.Tensor | None:
    """The tensor a module returned: the tensor itself, the first item of a tuple or list
    (a transformer block's hidden states come first), or a ``ModelOutput``'s (any
    mapping's) ``last_hidden_state``, else its first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, Mapping):
        hidden = output.get("last_hidden_state")
        if isinstance(hidden, torch.Tensor):
            return hidden
        return next((v for v in output.values() if isinstance(v, torch.Tensor)), None)
    return None


def not_captured(output) -> str | None:
    """Why a module's output is not a layer output the views can read (None: it is)."""
    x = first_tensor(output)
    if x is None:
        return f"it returned {type(output).__name__}, no tensor"
    if not x.is_floating_point():
        return f"it returned a {str(x.dtype).replace('torch.', '')} tensor"
    if x.dim() < 1:
        return "it returned a scalar"
    return None


def untrained_parameters(model: nn.Module, optimizer: torch.optim.Optimizer | None
                         ) -> list[str]:
    """Names ``<layer>/<parameter>`` of the parameters with ``requires_grad`` that no
    parameter group of ``optimizer`` holds: they get gradients, and neither ``step()`` nor
    ``zero_grad()`` touches them. Empty without an optimizer, and when the optimizer holds
    none of the model's parameters (an optimizer over copies, such as master weights: not
    known here)."""
    if optimizer is None:
        return []
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    out, any_held = [], False
    for full, p in model.named_parameters():
        if id(p) in held:
            any_held = True
        elif p.requires_grad:
            layer, _, short = full.rpartition(".")
            out.append(sanitize(f"{layer or ROOT}/{short}"))
    return out if any_held else []


def optimizer_signature(optimizer: torch.optim.Optimizer | None) -> tuple[int, ...]:
    """What changes when the optimizer's groups change (``add_param_group``, a group
    replaced): the number of groups and of parameters in each; cheap to compare at a point."""
    if optimizer is None:
        return ()
    return tuple(len(g["params"]) for g in optimizer.param_groups)


def final_module(model: nn.Module) -> str:
    """The type name of the module that certainly makes the model's output: the last
    module of an ``nn.Sequential`` (descending into nested ones); "" where the forward
    order is not known from the structure (a custom ``forward``)."""
    m = model
    while isinstance(m, nn.Sequential) and len(m):
        m = m[-1]
    return type(m).__name__ if m is not model and next(m.children(), None) is None else ""
