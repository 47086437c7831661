"""The four demo scenarios: small Keras models and optimizers that reproduce one situation each.

The settings were tuned on the 8×8 digits, over several seeds, so that each run shows its
situation in the logged statistics (``tests/test_demo.py`` checks it for the quick variant):

* ``healthy_cnn``: a small CNN with SGD + momentum at a comfortable learning rate;
* ``lr_too_high_cnn``: the same CNN with 3× the learning rate: it keeps up for the first
  epochs, then per-step losses spike and the loss climbs again (with some seeds it diverges),
  consecutive epoch gradients point against each other and units of the first conv layer die;
* ``dying_relu_mlp``: a plain ReLU MLP whose learning-rate warm-up overshoots; it learns
  first, then, as the rate grows, the dead rate climbs to 75-100% layer after layer, almost
  every first-layer gradient entry becomes exactly zero and the loss climbs back towards
  chance (ln 10 ≈ 2.30);
* ``vanishing_sigmoid_mlp``: eight sigmoid layers; the first layer's gradient RMS is
  ~1e-4..1e-3 of the last layer's and the loss hardly moves from chance.

Keras is imported inside the builders so that listing the scenarios stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Defaults shared by every scenario.
BATCH_SIZE = 32
EPOCHS = 20
#: SGD momentum of every scenario; with it a constant gradient moves the weights by
#: ``rate / (1 - MOMENTUM)`` per step (the implicit learning rate the tab shows).
MOMENTUM = 0.9
#: Learning rate of the healthy CNN.
HEALTHY_LR = 0.03


@dataclass(frozen=True)
class Scenario:
    """One demo run: how to build it and what a user should see in the Introspect tab."""

    name: str  # run name stem, e.g. "healthy_cnn"
    title: str  # one line for progress bars and listings
    look_for: str  # what the Introspect tab shows for this run
    build: Callable[[int], tuple[Any, Any]]  # total_steps -> (model, optimizer)
    quick_epochs: int  # epochs of the fast variant (tests): still enough to show the situation


def _cnn(name: str) -> Any:
    import keras
    from keras import layers

    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            # 16×16 gives the convolutions some room; the digits themselves are 8×8.
            layers.UpSampling2D(2, name="upsample"),
            layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
            layers.MaxPooling2D(2, name="pool1"),
            layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            layers.MaxPooling2D(2, name="pool2"),
            layers.Flatten(name="flatten"),
            layers.Dense(64, activation="relu", name="dense"),
            layers.Dense(10, activation="softmax", name="classifier"),
        ],
        name=name,
    )


def _mlp(name: str, width: int, depth: int, activation: str) -> Any:
    import keras
    from keras import layers

    hidden = [
        layers.Dense(width, activation=activation, name=f"dense{i + 1}") for i in range(depth)
    ]
    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            layers.Flatten(name="flatten"),
            *hidden,
            layers.Dense(10, activation="softmax", name="classifier"),
        ],
        name=name,
    )


def _sgd(learning_rate: Any) -> Any:
    import keras

    return keras.optimizers.SGD(learning_rate=learning_rate, momentum=MOMENTUM)


def build_healthy_cnn(total_steps: int) -> tuple[Any, Any]:
    """The reference CNN at a learning rate it trains well with."""
    return _cnn("healthy_cnn"), _sgd(HEALTHY_LR)


def build_lr_too_high_cnn(total_steps: int) -> tuple[Any, Any]:
    """The same CNN, learning rate 0.1 instead of 0.03."""
    # 0.06 still converges; 0.15 fails within two epochs. With Keras 3.15, 0.09 converged
    # and 0.11 fell apart in the second epoch; 0.1 is the "slightly too high" rate of the
    # article: it tracks the healthy run early and falls apart near the optimum.
    return _cnn("lr_too_high_cnn"), _sgd(0.1)


def build_dying_relu_mlp(total_steps: int) -> tuple[Any, Any]:
    """Four ReLU layers; the learning rate ramps linearly from 0.01 to 0.3 over the run."""
    import keras

    # A constant too-high rate kills the units in the first few steps, or not at all,
    # depending on the seed. The ramp makes the death gradual and reliable: the model
    # learns first, then the dead rate climbs as the rate passes ~0.15.
    # CosineDecay with alpha=1 never decays: it is just the linear warm-up.
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.01,
        decay_steps=1,
        alpha=1.0,
        warmup_target=0.3,
        warmup_steps=max(1, total_steps),
    )
    return _mlp("dying_relu_mlp", width=64, depth=4, activation="relu"), _sgd(schedule)


def build_vanishing_sigmoid_mlp(total_steps: int) -> tuple[Any, Any]:
    """Eight sigmoid layers: each multiplies the backward signal by at most 0.25."""
    return _mlp("vanishing_sigmoid_mlp", width=32, depth=8, activation="sigmoid"), _sgd(0.05)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "healthy_cnn",
        "healthy CNN (SGD, lr 0.03)",
        "loss falls smoothly with narrow per-epoch bands; gradient RMS of all layers within"
        " one order of magnitude; few dead units",
        build_healthy_cnn,
        quick_epochs=4,
    ),
    Scenario(
        "lr_too_high_cnn",
        "same CNN, learning rate slightly too high (0.1)",
        "first epochs track the healthy run, then per-step loss spikes and the loss climbs"
        " again; consecutive epoch gradients point against each other (negative cosine);"
        " conv1 units die",
        build_lr_too_high_cnn,
        quick_epochs=12,  # the trouble starts after epoch ~6
    ),
    Scenario(
        "dying_relu_mlp",
        "ReLU MLP pushed into neuron death (lr warm-up 0.01 -> 0.3)",
        "learns first, then the dead rate climbs to 75-100% layer after layer, first-layer"
        " gradients become almost all exactly zero and the loss climbs back towards chance",
        build_dying_relu_mlp,
        quick_epochs=8,
    ),
    Scenario(
        "vanishing_sigmoid_mlp",
        "deep sigmoid MLP (8 layers) with vanishing gradients",
        "first-layer gradient RMS orders of magnitude below the last layer's (thick top band,"
        " thin bottom bands in the stack); loss stays near chance",
        build_vanishing_sigmoid_mlp,
        quick_epochs=3,
    ),
)


def scenario_names() -> list[str]:
    """Names of the scenarios, in run order."""
    return [s.name for s in SCENARIOS]


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``KeyError`` listing the valid names otherwise."""
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"unknown scenario {name!r}; expected one of {', '.join(scenario_names())}")
