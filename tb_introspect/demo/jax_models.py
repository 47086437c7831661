"""The four demo scenarios in Flax Linen: the Keras demo's models (``models.py``), layer for
layer, with the same names, initialisation, optimizers and learning rates.

As in ``torch_models.py``, a layer is a dense or convolution layer and its activation, one
module whose tapped output is after the activation (``taps.tap``), so the layer outputs,
their dead rates and the findings read as in the Keras runs. Weights start Glorot-uniform
with constant biases, as Keras's do.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from tb_introspect.demo.models import (
    CLIP_NORM,
    DEAD_BIAS,
    HEALTHY_LR,
    JUMP_STEP,
    MOMENTUM,
    TOO_HIGH_LR,
)
from tb_introspect.jax import tap

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu, "sigmoid": nn.sigmoid, "linear": lambda x: x,
}


class Dense(nn.Module):
    """``keras.layers.Dense``: a dense layer and its activation, its output tapped."""

    units: int
    activation: str = "linear"
    bias: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.initializers.glorot_uniform(), (x.shape[-1], self.units))
        bias = self.param("bias", nn.initializers.constant(self.bias), (self.units,))
        return tap(self, ACTIVATIONS[self.activation](x @ kernel + bias))


class Conv(nn.Module):
    """``keras.layers.Conv2D(..., padding="same")``, 3x3: a convolution and its activation."""

    channels: int
    activation: str = "linear"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.initializers.glorot_uniform(),
                            (3, 3, x.shape[-1], self.channels))
        bias = self.param("bias", nn.initializers.zeros, (self.channels,))
        y = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return tap(self, ACTIVATIONS[self.activation](y + bias))


class CNN(nn.Module):
    """Upsample 8x8 -> 16x16, conv 16 + pool, conv 32 + pool, dense 64, classifier 10."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)  # nearest upsampling
        x = nn.max_pool(Conv(16, "relu", name="conv1")(x), (2, 2), (2, 2))
        x = nn.max_pool(Conv(32, "relu", name="conv2")(x), (2, 2), (2, 2))
        x = Dense(64, "relu", name="dense")(x.reshape(x.shape[0], -1))
        return Dense(10, name="classifier")(x)


class MLP(nn.Module):
    width: int
    depth: int
    activation: str
    bias: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], -1)
        for i in range(self.depth):
            x = Dense(self.width, self.activation, self.bias, name=f"dense{i + 1}")(x)
        return Dense(10, name="classifier")(x)


#: Per scenario: the model, its optimizer, and the layers whose outputs are ReLUs'.
def build(name: str) -> tuple[nn.Module, optax.GradientTransformation, list[str]]:
    """The model, optimizer and rectifier layers of scenario ``name``."""
    if name == "healthy_cnn":
        return CNN(), optax.sgd(HEALTHY_LR, momentum=MOMENTUM), ["conv1", "conv2", "dense"]
    if name == "lr_too_high_cnn":
        # Keras's piecewise-constant rate: two epochs at the healthy rate, then too high.
        rate = optax.piecewise_constant_schedule(HEALTHY_LR,
                                                 {JUMP_STEP: TOO_HIGH_LR / HEALTHY_LR})
        return CNN(), optax.chain(optax.clip_by_global_norm(CLIP_NORM),
                                  optax.sgd(rate, momentum=MOMENTUM)), ["conv1", "conv2", "dense"]
    if name == "dying_relu_mlp":
        return (MLP(64, 4, "relu", DEAD_BIAS), optax.sgd(HEALTHY_LR, momentum=MOMENTUM),
                [f"dense{i + 1}" for i in range(4)])
    if name == "vanishing_sigmoid_mlp":
        return MLP(32, 8, "sigmoid"), optax.sgd(0.05, momentum=MOMENTUM), []
    raise KeyError(f"unknown scenario {name!r}")


