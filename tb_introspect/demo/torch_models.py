"""The four demo scenarios in PyTorch: the Keras demo's models (``models.py``), layer for
layer and with the same names, initialisation, optimizers and learning rates.

A Keras ``Dense(..., activation="relu")`` is one layer whose output is after the
activation; ``Dense`` and ``Conv`` here are the same (a ``Linear`` / ``Conv2d`` with an
``activation``), so the layer outputs, their dead rates and the findings read the same in
both runs. Weights start Glorot-uniform with zero biases, as Keras's do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tb_introspect.demo.models import (
    HEALTHY_LR,
    MOMENTUM,
    TOO_HIGH_LR,
    WARMUP_START,
    WARMUP_STEPS,
)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu, "sigmoid": torch.sigmoid, "linear": lambda x: x,
}


def _keras_init(module: nn.Module) -> None:
    nn.init.xavier_uniform_(module.weight)
    nn.init.zeros_(module.bias)


class Dense(nn.Linear):
    """``keras.layers.Dense``: a Linear layer and its activation, one module."""

    def __init__(self, fan_in: int, units: int, activation: str = "linear"):
        super().__init__(fan_in, units)
        self.activation = activation  # "relu" makes it a rectifier for the Introspector
        _keras_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.activation](super().forward(x))


class Conv(nn.Conv2d):
    """``keras.layers.Conv2D(..., padding="same")``: a convolution and its activation."""

    def __init__(self, channels_in: int, channels: int, activation: str = "linear"):
        super().__init__(channels_in, channels, 3, padding=1)
        self.activation = activation
        _keras_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.activation](super().forward(x))


def cnn() -> nn.Sequential:
    """Upsample 8x8 -> 16x16, conv 16 + pool, conv 32 + pool, dense 64, classifier 10."""
    return nn.Sequential(OrderedDict([
        ("upsample", nn.Upsample(scale_factor=2, mode="nearest")),
        ("conv1", Conv(1, 16, "relu")), ("pool1", nn.MaxPool2d(2)),
        ("conv2", Conv(16, 32, "relu")), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("dense", Dense(32 * 4 * 4, 64, "relu")),
        ("classifier", Dense(64, 10)),
    ]))


def mlp(width: int, depth: int, activation: str) -> nn.Sequential:
    layers: list[tuple[str, nn.Module]] = [("flatten", nn.Flatten())]
    fan_in = 64
    for i in range(depth):
        layers.append((f"dense{i + 1}", Dense(fan_in, width, activation)))
        fan_in = width
    layers.append(("classifier", Dense(fan_in, 10)))
    return nn.Sequential(OrderedDict(layers))


def _sgd(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)


def build(name: str, total_steps: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """(model, optimizer, per-step learning-rate scheduler or None) of scenario ``name``."""
    if name == "healthy_cnn":
        model = cnn()
        return model, _sgd(model, HEALTHY_LR), None
    if name == "lr_too_high_cnn":
        model = cnn()
        opt = _sgd(model, WARMUP_START)
        # Keras's one-epoch linear warm-up to the too-high rate, then constant.
        peak = TOO_HIGH_LR / WARMUP_START
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: 1.0 + (peak - 1.0) * min(step, WARMUP_STEPS) / WARMUP_STEPS)
        return model, opt, sched
    if name == "dying_relu_mlp":
        model = mlp(64, 4, "relu")
        opt = _sgd(model, 0.01)
        # Keras's linear warm-up from 0.01 to 0.3 over the run, stepped every batch.
        ramp = max(1, total_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: 1.0 + (30.0 - 1.0) * min(step, ramp) / ramp)
        return model, opt, sched
    if name == "vanishing_sigmoid_mlp":
        model = mlp(32, 8, "sigmoid")
        return model, _sgd(model, 0.05), None
    raise KeyError(f"unknown scenario {name!r}")
