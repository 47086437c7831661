"""The four demo scenarios in Flax, Linen and NNX: the Keras demo's models (``models.py``),
layer for layer, with the same names, initialisation, optimizers and learning rates.

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
from flax import nnx

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


class NnxDense(nnx.Module):
    """``Dense`` in NNX."""

    def __init__(self, features: int, units: int, activation: str = "linear",
                 bias: float = 0.0, *, rngs: nnx.Rngs) -> None:
        self.kernel = nnx.Param(nn.initializers.glorot_uniform()(rngs.params(),
                                                                 (features, units)))
        self.bias = nnx.Param(jnp.full((units,), bias, jnp.float32))
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        return tap(self, ACTIVATIONS[self.activation](x @ self.kernel[...] + self.bias[...]))


class NnxConv(nnx.Module):
    """``Conv`` in NNX."""

    def __init__(self, features: int, channels: int, activation: str = "linear", *,
                 rngs: nnx.Rngs) -> None:
        self.kernel = nnx.Param(nn.initializers.glorot_uniform()(
            rngs.params(), (3, 3, features, channels)))
        self.bias = nnx.Param(jnp.zeros((channels,), jnp.float32))
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x, self.kernel[...], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return tap(self, ACTIVATIONS[self.activation](y + self.bias[...]))


class NnxCNN(nnx.Module):
    """``CNN`` in NNX, for 8x8 one-channel images."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv1 = NnxConv(1, 16, "relu", rngs=rngs)
        self.conv2 = NnxConv(16, 32, "relu", rngs=rngs)
        self.dense = NnxDense(4 * 4 * 32, 64, "relu", rngs=rngs)
        self.classifier = NnxDense(64, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
        x = nn.max_pool(self.conv1(x), (2, 2), (2, 2))
        x = nn.max_pool(self.conv2(x), (2, 2), (2, 2))
        return self.classifier(self.dense(x.reshape(x.shape[0], -1)))


class NnxMLP(nnx.Module):
    """``MLP`` in NNX, for 8x8 images: its layers ``dense1``... as attributes, as Linen
    names them."""

    def __init__(self, width: int, depth: int, activation: str, bias: float = 0.0, *,
                 rngs: nnx.Rngs) -> None:
        self.depth = depth
        for i in range(depth):
            setattr(self, f"dense{i + 1}", NnxDense(64 if i == 0 else width, width,
                                                     activation, bias, rngs=rngs))
        self.classifier = NnxDense(width, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], -1)
        for i in range(self.depth):
            x = getattr(self, f"dense{i + 1}")(x)
        return self.classifier(x)


#: Per scenario: its model's Linen class, and its NNX model made from the rngs.
_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[nnx.Rngs], nnx.Module]]] = {
    "healthy_cnn": (CNN, lambda rngs: NnxCNN(rngs=rngs)),
    "lr_too_high_cnn": (CNN, lambda rngs: NnxCNN(rngs=rngs)),
    "dying_relu_mlp": (lambda: MLP(64, 4, "relu", DEAD_BIAS),
                       lambda rngs: NnxMLP(64, 4, "relu", DEAD_BIAS, rngs=rngs)),
    "vanishing_sigmoid_mlp": (lambda: MLP(32, 8, "sigmoid"),
                              lambda rngs: NnxMLP(32, 8, "sigmoid", rngs=rngs)),
}
#: The layers whose outputs are ReLUs'.
RECTIFIERS = {"healthy_cnn": ["conv1", "conv2", "dense"],
              "lr_too_high_cnn": ["conv1", "conv2", "dense"],
              "dying_relu_mlp": [f"dense{i + 1}" for i in range(4)],
              "vanishing_sigmoid_mlp": []}


def optimizer(name: str) -> optax.GradientTransformation:
    """Scenario ``name``'s optimizer."""
    if name == "lr_too_high_cnn":
        # Keras's piecewise-constant rate: two epochs at the healthy rate, then too high.
        rate = optax.piecewise_constant_schedule(HEALTHY_LR,
                                                 {JUMP_STEP: TOO_HIGH_LR / HEALTHY_LR})
        return optax.chain(optax.clip_by_global_norm(CLIP_NORM),
                           optax.sgd(rate, momentum=MOMENTUM))
    return optax.sgd(0.05 if name == "vanishing_sigmoid_mlp" else HEALTHY_LR,
                     momentum=MOMENTUM)


def build(name: str, seed: int = 0, flax: str = "linen") -> tuple[
        nn.Module | nnx.Module, optax.GradientTransformation, list[str]]:
    """The model (Linen's, or NNX's initialised from ``seed``), optimizer and rectifier
    layers of scenario ``name``."""
    if name not in _MODELS:
        raise KeyError(f"unknown scenario {name!r}")
    linen, nnx_model = _MODELS[name]
    model = linen() if flax == "linen" else nnx_model(nnx.Rngs(seed))
    return model, optimizer(name), RECTIFIERS[name]
