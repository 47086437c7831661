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
from typing import Any, NamedTuple

import torch
from torch import nn

from tb_introspect.demo.models import (
    CLIP_NORM,
    DEAD_BIAS,
    HEALTHY_LR,
    JUMP_STEP,
    MOMENTUM,
    TOO_HIGH_LR,
)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu, "sigmoid": torch.sigmoid, "linear": lambda x: x,
}


def _keras_init(module: nn.Module, bias: float = 0.0) -> None:
    nn.init.xavier_uniform_(module.weight)
    nn.init.constant_(module.bias, bias)


class Dense(nn.Linear):
    """``keras.layers.Dense``: a Linear layer and its activation, one module."""

    def __init__(self, fan_in: int, units: int, activation: str = "linear", bias: float = 0.0):
        super().__init__(fan_in, units)
        self.activation = activation  # "relu" makes it a rectifier for the Introspector
        _keras_init(self, bias)

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


def mlp(width: int, depth: int, activation: str, bias: float = 0.0) -> nn.Sequential:
    layers: list[tuple[str, nn.Module]] = [("flatten", nn.Flatten())]
    fan_in = 64
    for i in range(depth):
        layers.append((f"dense{i + 1}", Dense(fan_in, width, activation, bias)))
        fan_in = width
    layers.append(("classifier", Dense(fan_in, 10)))
    return nn.Sequential(OrderedDict(layers))


def _sgd(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)


class Setup(NamedTuple):
    """What the training loop of one scenario needs."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None  # stepped after every optimizer step
    clip_norm: float | None = None  # global gradient-norm clip before every step


def build(name: str) -> Setup:
    """The model, optimizer, scheduler and clip of scenario ``name``."""
    if name == "healthy_cnn":
        model = cnn()
        return Setup(model, _sgd(model, HEALTHY_LR))
    if name == "lr_too_high_cnn":
        model = cnn()
        opt = _sgd(model, HEALTHY_LR)
        # Keras's piecewise-constant rate: two epochs at the healthy rate, then too high.
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: 1.0 if step < JUMP_STEP else TOO_HIGH_LR / HEALTHY_LR)
        return Setup(model, opt, sched, CLIP_NORM)
    if name == "dying_relu_mlp":
        model = mlp(64, 4, "relu", bias=DEAD_BIAS)
        return Setup(model, _sgd(model, HEALTHY_LR))
    if name == "vanishing_sigmoid_mlp":
        model = mlp(32, 8, "sigmoid")
        return Setup(model, _sgd(model, 0.05))
    raise KeyError(f"unknown scenario {name!r}")
