"""The four demo scenarios: small Keras models and optimizers that reproduce one situation each.

The settings were chosen on the 8×8 digits so that each run shows its situation by a wide
margin, with any seed, thread count and CPU, not on one lucky trajectory: ``story`` names
the finding kinds that mean the situation (one of them must show) and ``contradicts`` those
that would tell another one. ``tests/test_demo.py`` and ``tests/torch/test_torch_demo.py``
check them for the quick variant, the latter under two thread counts and two seeds:

* ``healthy_cnn``: a small CNN with SGD + momentum at a comfortable learning rate;
* ``lr_too_high_cnn``: the same CNN whose rate warms up over the first epoch to 0.15, 5× the
  healthy rate: it learns during the warm-up, then consecutive epoch gradients point against
  each other while the loss stalls (or climbs back towards chance), and conv units die;
* ``dying_relu_mlp``: a plain ReLU MLP whose learning-rate warm-up overshoots; it learns
  first, then, as the rate grows, the dead rate climbs to 75-100% layer after layer, almost
  every first-layer gradient entry becomes exactly zero and the loss climbs back towards
  chance (ln 10 ≈ 2.30);
* ``vanishing_sigmoid_mlp``: eight sigmoid layers; the first layer's gradient RMS is
  ~1e-4..1e-3 of the last layer's and the loss hardly moves from chance.

Keras is imported inside the builders so that listing the scenarios stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
#: The too-high rate of ``lr_too_high_cnn``, reached after ``WARMUP_STEPS`` steps from
#: ``WARMUP_START``.
TOO_HIGH_LR = 0.15
WARMUP_START = 0.01
#: One epoch of the digits' training split at ``BATCH_SIZE`` (1437 / 32).
WARMUP_STEPS = 45

#: Severities a story is told by; "info" findings are hints that healthy runs show too.
SERIOUS = ("warning", "critical")

#: Finding kinds (``tb_introspect.diagnose``) that mean "the steps are too large": the
#: optimizer bouncing across the valley, the loss spiking or giving its progress back,
#: gradients or updates blowing up. Dead units are a consequence, not a sign of it: the
#: dying-ReLU run shows them at a sane rate too.
LR_TOO_HIGH_KINDS = frozenset({
    "gradient_oscillation", "loss_rising", "loss_spikes", "exploding_gradients", "nonfinite",
    "early_instability", "update_ratio_high",
})
#: Units that stopped firing: the dying-ReLU story.
DEAD_UNIT_KINDS = frozenset({"dead_units", "dying_units"})
#: A backward signal that fades on its way to the first layers.
VANISHING_KINDS = frozenset({"vanishing_gradients"})


@dataclass(frozen=True)
class Scenario:
    """One demo run: how to build it and what a user should see in the Introspect tab."""

    name: str  # run name stem, e.g. "healthy_cnn"
    title: str  # one line for progress bars and listings
    look_for: str  # what the Introspect tab shows for this run
    build: Callable[[int], tuple[Any, Any]]  # total_steps -> (model, optimizer)
    quick_epochs: int  # epochs of the fast variant (tests): still enough to show the situation
    #: Serious finding kinds that mean this situation: at least one must show. Empty for a
    #: healthy run, which must show no warning or critical finding at all.
    story: frozenset[str] = frozenset()
    #: Serious finding kinds that would tell another story: none may show.
    contradicts: frozenset[str] = frozenset()

    def story_problems(self, kinds: Iterable[str]) -> list[str]:
        """Why a run whose serious findings have ``kinds`` does not tell this scenario's
        story; empty when it does."""
        kinds = set(kinds)
        if not self.story:
            return [f"a healthy run shows {sorted(kinds)}"] if kinds else []
        problems = []
        if not kinds & self.story:
            problems.append(f"none of {sorted(self.story)} among {sorted(kinds)}")
        if kinds & self.contradicts:
            problems.append(f"{sorted(kinds & self.contradicts)} tell another story")
        return problems


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
    """The same CNN; the rate warms up from 0.01 to 0.15 over the first epoch, then stays."""
    import keras

    # A constant 0.1 (3x the healthy rate) sat on the edge: whether its gradients turned
    # against each other within 12 epochs, or it went on at ~90% accuracy, changed with the
    # CPU and the thread count. A constant 0.15 kills the fresh net in its first steps with
    # some seeds (no learning at all, then only dead units show). The one-epoch warm-up lets
    # every seed learn first; 0.15 after it then bounces, stalls or collapses every time.
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=WARMUP_START,
        decay_steps=1,
        alpha=1.0,  # no decay: the schedule is only the warm-up
        warmup_target=TOO_HIGH_LR,
        warmup_steps=WARMUP_STEPS,
    )
    return _cnn("lr_too_high_cnn"), _sgd(schedule)


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
        "same CNN, learning rate too high (warm-up to 0.15)",
        "learns during the one-epoch warm-up, then consecutive epoch gradients point against"
        " each other (negative cosine) while the loss stalls or climbs back; conv units die",
        build_lr_too_high_cnn,
        quick_epochs=12,
        story=LR_TOO_HIGH_KINDS,
        contradicts=VANISHING_KINDS | {"saturated_units", "poor_initialization", "identical_units"},
    ),
    Scenario(
        "dying_relu_mlp",
        "ReLU MLP pushed into neuron death (lr warm-up 0.01 -> 0.3)",
        "learns first, then the dead rate climbs to 75-100% layer after layer, first-layer"
        " gradients become almost all exactly zero and the loss climbs back towards chance",
        build_dying_relu_mlp,
        quick_epochs=8,
        story=DEAD_UNIT_KINDS,
        contradicts=VANISHING_KINDS | {"saturated_units", "identical_units"},
    ),
    Scenario(
        "vanishing_sigmoid_mlp",
        "deep sigmoid MLP (8 layers) with vanishing gradients",
        "first-layer gradient RMS orders of magnitude below the last layer's (thick top band,"
        " thin bottom bands in the stack); loss stays near chance",
        build_vanishing_sigmoid_mlp,
        quick_epochs=3,
        story=VANISHING_KINDS,
        # Its sigmoids sit mid-range (the derivative <= 0.25 is the cause): neither dead nor
        # saturated, and its steps are not too large.
        contradicts=DEAD_UNIT_KINDS | LR_TOO_HIGH_KINDS | {"saturated_units", "identical_units"},
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
