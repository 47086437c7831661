"""The four demo scenarios: small Keras models and optimizers that reproduce one situation each.

Each situation follows from a mechanism that cannot end otherwise, not from a rate tuned on
one machine: whatever the seed, the thread count or the CPU's kernels, the run tells its
story (``benchmarks/demo_robustness.py`` trains the matrix). ``story`` names the finding
kinds that mean the situation (one of them must show) and ``contradicts`` those that would
tell another one:

* ``healthy_cnn``: a small CNN with SGD + momentum at a comfortable learning rate;
* ``lr_too_high_cnn``: the same CNN learns for two epochs at the healthy rate, then the rate
  jumps to 1.0, where one step can move the weights as far as their own norm: the loss
  gives its progress back and stays there. A global gradient-norm clip keeps every number
  finite, so the run tells "the steps are too large" rather than "NaN";
* ``dying_relu_mlp``: a ReLU MLP whose biases start at -1: on these inputs (pixels in
  [0, 1]) most of the first layer's units are below zero for every sample from the first
  step, and a unit that never fires gets no gradient, so it never recovers; the layers above
  see almost only zeros and die with it;
* ``vanishing_sigmoid_mlp``: eight sigmoid layers; each multiplies the backward signal by at
  most 0.25, so the first layer's gradient RMS is ~1e-4 of the last layer's and the loss
  hardly moves from chance.

No run but a NaN story may go non-finite; none of these four is one.

Keras is imported inside the builders so that listing the scenarios stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: Defaults shared by every scenario.
BATCH_SIZE = 32
EPOCHS = 20
#: SGD momentum of every scenario; with it a constant gradient moves the weights by
#: ``rate / (1 - MOMENTUM)`` per step (the implicit learning rate the tab shows).
MOMENTUM = 0.9
#: Learning rate of the healthy CNN.
HEALTHY_LR = 0.03
#: The rate ``lr_too_high_cnn`` jumps to after ``JUMP_STEP`` steps at ``HEALTHY_LR``:
#: 33x the healthy rate, with momentum a step of up to ``TOO_HIGH_LR * CLIP_NORM / (1 -
#: MOMENTUM)`` = 10 in norm, as large as the norm of the CNN's largest weight tensor.
TOO_HIGH_LR = 1.0
#: Global gradient-norm clip of ``lr_too_high_cnn``: the steps stay bounded, so the weights,
#: the logits and the loss stay finite however far the rate is past a stable one.
CLIP_NORM = 1.0
#: Two epochs of the digits' training split at ``BATCH_SIZE`` (1437 / 32 = 45 steps each):
#: by then the CNN is at a third of its starting loss or less, so the loss the too-high
#: rate gives back is unmistakable.
JUMP_STEP = 90
#: Initial bias of every hidden layer of ``dying_relu_mlp``. With Glorot-uniform weights on
#: pixels in [0, 1], 53-89% of the first layer's 64 units are below zero for every training
#: sample (200 draws of the weights), and the layers above, fed those few small outputs,
#: start almost all dead.
DEAD_BIAS = -1.0

#: Severities a story is told by; "info" findings are hints that healthy runs show too.
SERIOUS = ("warning", "critical")

#: Finding kinds (``tb_introspect.diagnose``) that mean "the steps are too large": the
#: optimizer bouncing across the valley, the loss spiking or giving its progress back,
#: gradients or updates blowing up. Dead units are a consequence, not a sign of it: the
#: dying-ReLU run shows them at a sane rate too.
LR_TOO_HIGH_KINDS = frozenset({
    "gradient_oscillation", "loss_rising", "loss_spike", "exploding_gradients",
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
    #: total_steps -> (model, optimizer); the builders of the tests' own models take the
    #: run's length too (a schedule may need it), the demo's ignore it
    build: Callable[[int], tuple[Any, Any]]
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
        if "nonfinite" in kinds:
            problems.append("a non-finite value: none of the demo's stories is one of NaN")
        if not kinds & self.story:
            problems.append(f"none of {sorted(self.story)} among {sorted(kinds)}")
        if kinds & self.contradicts:
            problems.append(f"{sorted(kinds & self.contradicts)} tell another story")
        return problems


@dataclass
class RunResult:
    """What one scenario's training produced (Keras's ``demo/run.py`` and PyTorch's
    ``demo/torch_run.py`` alike)."""

    scenario: Scenario
    run_name: str
    path: str
    epochs: int
    seconds: float
    history: dict[str, list[float]] = field(default_factory=dict)

    def final(self, key: str) -> float:
        """Last epoch's value of a Keras history entry (NaN when absent)."""
        values = self.history.get(key) or [math.nan]
        return float(values[-1])


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


def _mlp(name: str, width: int, depth: int, activation: str, bias: float = 0.0) -> Any:
    import keras
    from keras import layers

    hidden = [
        layers.Dense(width, activation=activation, name=f"dense{i + 1}",
                     bias_initializer=keras.initializers.Constant(bias))
        for i in range(depth)
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


def _sgd(learning_rate: Any, **clip: float) -> Any:
    import keras

    return keras.optimizers.SGD(learning_rate=learning_rate, momentum=MOMENTUM, **clip)


def build_healthy_cnn(total_steps: int) -> tuple[Any, Any]:
    """The reference CNN at a learning rate it trains well with."""
    return _cnn("healthy_cnn"), _sgd(HEALTHY_LR)


def build_lr_too_high_cnn(total_steps: int) -> tuple[Any, Any]:
    """The same CNN: two epochs at the healthy rate, then ``TOO_HIGH_LR``, clipped."""
    import keras

    # Steps 0 .. JUMP_STEP - 1 at the healthy rate (Keras counts from 0 and keeps the
    # first value up to and including the boundary).
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [JUMP_STEP - 1], [HEALTHY_LR, TOO_HIGH_LR])
    return _cnn("lr_too_high_cnn"), _sgd(schedule, global_clipnorm=CLIP_NORM)


def build_dying_relu_mlp(total_steps: int) -> tuple[Any, Any]:
    """Four ReLU layers whose biases start at ``DEAD_BIAS``, at the healthy rate."""
    model = _mlp("dying_relu_mlp", width=64, depth=4, activation="relu", bias=DEAD_BIAS)
    return model, _sgd(HEALTHY_LR)


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
        "same CNN, learning rate too high (0.03, then 1.0 from epoch 2, clipped)",
        "learns for two epochs, then the rate jumps 33x: the loss spikes at the jump and"
        " climbs back to chance, the steps scatter the weights and the conv units die",
        build_lr_too_high_cnn,
        quick_epochs=8,
        story=LR_TOO_HIGH_KINDS,
        contradicts=VANISHING_KINDS | {"saturated_units", "poor_initialization", "identical_units"},
    ),
    Scenario(
        "dying_relu_mlp",
        "ReLU MLP whose biases start at -1: dead units",
        "most first-layer units never fire and every layer above is dead from the first"
        " epoch; a unit that never fires gets exactly zero gradient, so none recovers and the"
        " loss stays at chance",
        build_dying_relu_mlp,
        quick_epochs=8,
        story=DEAD_UNIT_KINDS,
        # Dead layers pass no gradient down, which is not a vanishing signal: the rule leaves
        # exactly-zero gradients to dead_units.
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
