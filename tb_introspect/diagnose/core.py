"""The ``Finding`` type, the thresholds, the rule registry and the shared numpy helpers.

Numpy only, never TensorFlow. Rules read a :class:`~tb_introspect.read.series.RunSeries`
through :class:`RunView`, which aligns each view's tensors on one step axis
(:func:`tb_introspect.read.series.align`) and knows how many training steps each
logged point spans (needed to compare per-epoch aggregates with per-step rules
of thumb). Where the rules sit in the whole: ``docs/design.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tb_introspect.read.json_values import jsonable
from tb_introspect.read.series import Aligned, RunSeries, align
from tb_introspect.read.series import point_spans as point_spans  # re-exported for the rules
from tb_introspect.read.series import unique as unique
from tb_introspect.schema import PROBE_REFERENCES, SEVERITIES

SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class Finding:
    """One diagnosis of a run, JSON-ready through :meth:`to_json` (docs/findings.md)."""

    kind: str
    severity: str
    title: str
    first_step: int | None = None
    first_epoch: int | None = None
    layers: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    view: str | None = None
    metric: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    explanation: str = ""
    suggestion: str = ""
    #: Where the evidence is drawn: {"tab", "view", "tag", "chart"} (see docs/findings.md).
    jump: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {self.severity!r}; expected one of {SEVERITIES}")

    def to_json(self) -> dict[str, Any]:
        """A dict of JSON types only (non-finite numbers become ``None``, 4 significant digits)."""
        return jsonable(asdict(self), digits=4)


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against; docs/findings.md says where each comes from."""

    #: Fewest logged points a trend or "sustained" rule needs.
    min_points: int = 3
    #: A condition is "sustained" when it holds on this share of the points (at least 2).
    sustain_fraction: float = 0.1
    sustain_max_points: int = 10

    # vanishing: orders of magnitude between the last and the first layer's gradient RMS
    # (warning); from vanishing_info_orders (10x) up to it, an info finding
    vanishing_orders: float = 2.0
    vanishing_info_orders: float = 1.0
    # gradient activation rate (share of non-zero gradient entries of a kernel): a drop
    # below this, by at least grad_active_drop from its own start
    grad_active_low: float = 0.5
    grad_active_drop: float = 0.25
    # zero gradients: share of a kernel's gradient entries exactly zero; a cause is named
    # when it accounts for at least zero_cause_share of that
    zero_grad_share: float = 0.5
    zero_cause_share: float = 0.5
    # overfitting: validation loss this much above its best while the training loss is
    # this much below its value at that epoch
    overfit_val_rise: float = 0.1
    overfit_val_rise_warning: float = 0.5
    overfit_train_drop: float = 0.05
    # ... warning also when the parting has lasted this many epochs and the validation loss
    # reached this much above its best on the way, giving back this share of the progress
    # it made from its first epoch to its best
    overfit_climb_epochs: int = 3
    overfit_climb_rise: float = 0.2
    overfit_climb_giveback: float = 0.1
    # ... warning also when the validation loss is this much above its best and still
    # rising (its latest epoch above the one before)
    overfit_keep_rise: float = 1 / 3
    # ... and every grade but memorising needs the validation accuracy, where logged, this
    # much (absolute) below its best so far: a validation loss that rises while the accuracy
    # holds is confidence on the few samples the model gets wrong, not a worse model
    overfit_accuracy_drop: float = 0.03
    # ... warning also when the validation loss is this much above its best while the
    # training loss fell to this share of its value at the best epoch
    overfit_stop_rise: float = 0.25
    overfit_stop_train_drop: float = 0.1
    # ... and, where logged, the validation accuracy this much (absolute) below its value
    # at the best epoch
    overfit_stop_accuracy_drop: float = 0.02
    # memorisation: training loss at most this share of its first epoch's (or training
    # accuracy this many times chance) while validation never beat its first epoch and
    # its accuracy stays below this many times chance
    memorise_train_drop: float = 0.5
    memorise_train_accuracy: float = 2.0
    memorise_val_accuracy: float = 1.5
    # gradient pile-up: the median layer's per-step gradient RMS rising (by more than
    # pileup_step_orders) at each of the latest >= 3 points, by pileup_orders in all
    pileup_step_orders: float = 0.0
    pileup_orders: float = 0.5
    # ... over at least this many optimizer steps
    pileup_min_steps: int = 100
    # exploding: per-step gradient RMS (lower bound) of the median layer, and growth in orders
    exploding_rms: float = 1.0
    exploding_growth_orders: float = 2.0
    # oscillation: over the second half of the run, the median over layers of the cosine
    # between consecutive gradient aggregates is below oscillation_cos and at least
    # oscillation_share of the points are negative
    oscillation_cos: float = -0.1
    oscillation_share: float = 0.75
    # oscillation: layer-scale stack roughness (mean |second difference| of log10 RMS)
    jagged_roughness: float = 0.5
    # dead units (share of a layer's channels with no non-zero output in the window)
    dead_info: float = 0.25
    dead_warning: float = 0.5
    dead_critical: float = 0.99
    # activation rate collapse: below this, and this many times below its own start
    dying_activation_rate: float = 0.05
    dying_drop_factor: float = 4.0
    # saturation: |tanh| >= 0.99, sigmoid <= 0.01 or >= 0.99; share of values
    saturation_margin: float = 0.01
    saturation_warning: float = 0.5
    saturation_info: float = 0.25
    # update-to-weight ratio per step (Karpathy's ~1e-3)
    update_ratio_target: float = 1e-3
    update_ratio_high: float = 1e-1
    update_ratio_low: float = 1e-6
    # loss
    loss_min_decrease: float = 0.05
    # the loss has come most of the way down (the run learned its task) at this share of its
    # starting level or below: oscillation there is at the loss's floor, and dead units or
    # zero gradients cost nothing the run needed (info, not warning)
    loss_floor_share: float = 1 / 3
    # loss not decreasing is said once this many optimizer steps followed the first epoch
    loss_flat_min_steps: int = 60
    loss_rise_progress: float = 0.5
    loss_rise_factor: float = 1.5
    # loss spike, its second criterion (the first: the spike score below): a per-step loss
    # loss_spike_factor times the median of its previous loss_spike_window values and at
    # least half the median of the first loss_spike_window (the starting loss)
    loss_spike_factor: float = 10.0
    loss_spike_window: int = 20
    # chance level (classification): loss median within this share of ln K, accuracy
    # below this many times 1/K
    chance_tolerance: float = 0.02
    chance_accuracy_factor: float = 1.5
    # early instability: the first epoch's mean loss above ln K and a step this many times
    # above both ln K and the first step's loss
    early_jump_factor: float = 1.5
    # rectified output: share of the output layer's values exactly zero
    rectified_output_zero: float = 0.25
    # weight collapse: kernel RMS this many orders below its start, in this share of kernels
    collapse_orders: float = 1.0
    collapse_share: float = 0.5
    # poor initialisation: spread of the hidden layers' output RMS at the first point
    init_scale_orders: float = 2.0
    # ... judged between normalisations: an output of RMS 1 and mean 0 within this, from a
    # layer without a kernel, is a normalisation's
    init_norm_tolerance: float = 0.1
    # loss floor (probabilities into a from-logits loss): the loss median at least this
    # share of ln(1 + (K-1)/e), less than floor_stall down from the epoch before, while the
    # training accuracy is at least floor_accuracy
    floor_accuracy: float = 0.75
    floor_share: float = 1.0
    floor_stall: float = 0.1
    # loss without learning: the loss median at most this share of its value when the
    # training accuracy sat at chance (chance_accuracy_factor), with the accuracy still there
    penalty_loss_drop: float = 0.5
    # train/eval gap: validation accuracy at most gap_ratio x the training accuracy and
    # gap_points below it, while training is at gap_train_accuracy x chance or better
    gap_ratio: float = 0.6
    gap_points: float = 0.3
    gap_train_accuracy: float = 2.0
    # transformer probes (docs/findings.md, "Transformer signals"). Attention logits: the
    # largest |q.k/sqrt(d)| above attn_logit_high (Megatron-LM's QK-clip threshold), or grown
    # attn_logit_growth times from the first point and above attn_logit_watch
    attn_logit_high: float = PROBE_REFERENCES["attn_logit_max"]
    attn_logit_growth: float = 10.0
    attn_logit_watch: float = 30.0
    # output logits: the head's logsumexp moved logit_lse_drift nats from the first point, or
    # its largest logit grown logit_max_growth times to above logit_max_watch, either moving
    # the same way between at least logit_steady_share of consecutive points
    logit_lse_drift: float = 10.0
    logit_max_growth: float = 3.0
    logit_max_watch: float = 30.0
    logit_steady_share: float = 0.75
    # massive activations: max|a| above massive_abs and massive_ratio times the output's
    # median |a|; heavy tails: kurtosis above massive_kurtosis (3 for a Gaussian)
    massive_abs: float = PROBE_REFERENCES["massive_abs"]
    massive_ratio: float = PROBE_REFERENCES["massive_ratio"]
    massive_kurtosis: float = 100.0
    # update spike: a kernel's per-step update ratio update_spike_factor times the median of
    # its previous update_spike_window points (at least 3), and at least update_ratio_target,
    # in one of the update_spike_lead_points points up to the one holding a loss spike
    update_spike_factor: float = 10.0
    update_spike_window: int = 8
    update_spike_lead_points: int = 3
    # loss spike score (OLMo-core), the loss spike's first criterion and the one
    # update_spike reads: a per-step loss loss_spike_sigmas standard deviations above the
    # mean of its previous loss_spike_history values (at least loss_spike_min_history); the
    # deviation at least loss_spike_min_rel of that mean
    loss_spike_sigmas: float = 6.0
    loss_spike_history: int = 128
    loss_spike_min_history: int = 16
    loss_spike_min_rel: float = 1e-3
    # rules whose warning is provisional: a rule enters at info and becomes a warning only
    # once a real training with the pathology shows it (the validation tables) and the
    # healthy corpus stays silent on it (docs/findings.md, "Which rules may warn"); until
    # then its warnings are reported as info. An empty set gives every rule its full grading.
    provisional: frozenset[str] = frozenset({"output_logit_drift", "massive_activations",
                                             "update_spike"})


DEFAULT_THRESHOLDS = Thresholds()


# ---------------------------------------------------------------- aligned views


class RunView:
    """What the rules see of a run: aligned views and loss series, built lazily."""

    def __init__(self, run: RunSeries, thresholds: Thresholds = DEFAULT_THRESHOLDS):
        self.run = run
        self.t = thresholds
        self._aligned: dict[str, Aligned | None] = {}
        #: Results shared between rules (e.g. the per-layer gradient scales).
        self.memo: dict[str, Any] = {}

    def view(self, name: str) -> Aligned | None:
        """The aligned tensors of view ``name``, or ``None`` when it was not logged."""
        if name not in self._aligned:
            series = [s for s in self.run.tensors.get(name, []) if len(s)]
            self._aligned[name] = align(name, series) if series else None
        return self._aligned[name]

    def loss_name(self) -> str | None:
        """The metric the loss rules watch: ``loss``, else the first name containing "loss"."""
        names = sorted(set(self.run.metrics) | set(self.run.metric_epochs))
        if "loss" in names:
            return "loss"
        return next((n for n in names if "loss" in n.lower()), None)

    def sustain_points(self, n: int) -> int:
        """How many consecutive points make a condition "sustained" in a series of ``n``."""
        t = self.t
        return int(min(max(2, math.ceil(t.sustain_fraction * n)), t.sustain_max_points))

    def step_epoch(self, a: Aligned, j: int) -> tuple[int, int | None]:
        """(step, epoch) of column ``j`` of ``a``; no epoch in a step-based run."""
        e = a.epochs[j]
        return int(a.steps[j]), (int(e) if np.isfinite(e) and not self.step_based else None)

    @property
    def step_based(self) -> bool:
        """Whether the run is measured in steps: its points are windows of steps
        (``window=N``), read as epochs are, and named by their step."""
        if "step_based" not in self.memo:
            self.memo["step_based"] = any(
                s.info.cadence == "window" for ts in self.run.tensors.values() for s in ts)
        return self.memo["step_based"]

    def when(self, step: float, epoch: float | None) -> str:
        """"epoch E", or "step S" where the run is step-based or the epoch is not known."""
        if epoch is not None and np.isfinite(epoch) and not self.step_based:
            return f"epoch {int(epoch)}"
        return f"step {int(step)}"


# ---------------------------------------------------------------- helpers


def first_sustained(mask: np.ndarray, k: int) -> int | None:
    """Index where ``mask`` first holds for ``k`` consecutive points, or holds up to the end.

    A run that reaches the last point counts when it is at least ``min(k, 2)``
    long: a condition that appears near the end of a run and stays is still
    reported, one isolated last point is not.
    """
    mask = np.asarray(mask, dtype=bool)
    n = mask.size
    if n == 0:
        return None
    idx = np.arange(n)
    # Length of the run of True ending at each index (0 where False).
    run = idx - np.maximum.accumulate(np.where(mask, -1, idx))
    hit = np.flatnonzero(run >= k)
    if hit.size:
        return int(hit[0] - k + 1)
    if mask[-1] and run[-1] >= min(k, 2):
        return int(n - run[-1])
    return None


def trailing_run(mask: np.ndarray) -> int:
    """How many points at the end of ``mask`` are True in a row (0 when the last is False).

    Rules that decide "on the points so far" report a condition while it holds at the
    latest points, and drop it when a later point no longer supports it.
    """
    mask = np.asarray(mask, dtype=bool)
    if not mask.size or not mask[-1]:
        return 0
    off = np.flatnonzero(~mask)
    return int(mask.size - (off[-1] + 1 if off.size else 0))


def log10_pos(x: np.ndarray) -> np.ndarray:
    """log10 of the finite positive entries, NaN elsewhere."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(x) & (x > 0), np.log10(np.where(x > 0, x, 1.0)), np.nan)


def pow10(x: float) -> float:
    """10 ** ``x``, the inverse of ``log10_pos``: inf past 1e308 (a Python float's ``**``
    raises there), without numpy's overflow warning."""
    with np.errstate(over="ignore"):
        return float(np.power(10.0, x))


def nanmedian(m: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``np.nanmedian`` without the all-NaN warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(m, axis=axis)


def nanmax(m: np.ndarray, axis: int | None = None) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(m, axis=axis)


def nanmin(m: np.ndarray, axis: int | None = None) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(m, axis=axis)


def representative_rows(a: Aligned) -> list[int]:
    """One tensor per layer, in depth order: the layer's largest weight-like tensor.

    Kernels (rank >= 2) are preferred to biases and norm scales, whose scale
    follows other rules; a layer with only rank-1 tensors is used only when
    fewer than two layers have a kernel.
    """
    by_layer: dict[str, list[int]] = {}
    for i, s in enumerate(a.series):
        by_layer.setdefault(s.info.layer, []).append(i)

    def size(i: int) -> float:
        c = a.series[i].field("count")
        return float(np.nanmax(c)) if np.isfinite(c).any() else 0.0

    def rank(i: int) -> int:
        return len(a.series[i].info.shape)

    kernels, others = [], []
    for rows in by_layer.values():
        best = max(rows, key=lambda i: (rank(i) >= 2, size(i)))
        (kernels if rank(best) >= 2 else others).append(best)
    chosen = kernels if len(kernels) >= 2 else kernels + others
    return sorted(chosen, key=lambda i: (a.series[i].info.depth, a.series[i].info.layer))


def fmt_orders(x: float) -> str:
    """"10^2.3" style text for a log10 gap."""
    return f"10^{x:.1f}"


def fmt_num(x: float) -> str:
    """Compact number for titles."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}"
    return f"{x:.2e}"


#: Ratios from the first of these on are said in words: a diverging run's ratio printed
#: digit by digit ("253651458529045610496x") reads as noise, and its size is all it says.
_TIMES_WORDS = ((1e12, "a trillion"), (1e9, "a billion"), (1e6, "a million"))
#: Z-scores above this are said in words: against a near-zero spread (a flat stretch of the
#: series) a score measures the spread's smallness, not the jump.
SIGMA_WORDS_ABOVE = 1e3


def fmt_times(x: float, digits: int = 0) -> str:
    """A ratio for titles: "12x", or past a million "more than a million times" (billion,
    trillion); an infinite ratio is "more than a trillion times"."""
    if math.isnan(x):
        return "an unknown number of times"
    for bound, words in _TIMES_WORDS:
        if x >= bound:
            return f"more than {words} times"
    return f"{x:.{digits}f}x"


def fmt_sigmas(z: float, threshold: float) -> str:
    """A z-score for titles: "25 sigma", or "far beyond 6 sigma" (``threshold``) when it is
    past ``SIGMA_WORDS_ABOVE`` or not finite (a zero or overflowed spread)."""
    if not math.isfinite(z) or z > SIGMA_WORDS_ABOVE:
        return f"far beyond {threshold:g} sigma"
    return f"{z:.0f} sigma"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class Rule:
    """A rule: a name, the views/metrics it needs, and the function that applies it."""

    name: str
    needs: tuple[str, ...]  # view names, "loss" or "probes"
    check: Callable[[RunView], list[Finding]]
    #: True when the rule needs a time series (trend, sustained condition).
    needs_history: bool = True

    def applicable(self, rv: RunView) -> bool:
        """Whether the run has this rule's inputs (any one of ``needs``)."""
        for need in self.needs:
            if need == "loss":
                if rv.loss_name() is not None:
                    return True
            elif need == "probes":
                if rv.run.probes is not None and len(rv.run.probes):
                    return True
            elif rv.view(need) is not None:
                return True
        return False

    def n_points(self, rv: RunView) -> int:
        """Most logged points among the rule's inputs."""
        best = 0
        for need in self.needs:
            if need == "loss":
                name = rv.loss_name()
                if name is None:
                    continue
                s = rv.run.metrics.get(name)
                e = rv.run.metric_epochs.get(name)
                best = max(best, len(s) if s is not None else 0, len(e) if e is not None else 0)
            elif need == "probes":
                best = max(best, len(rv.run.probes) if rv.run.probes is not None else 0)
            else:
                a = rv.view(need)
                best = max(best, a.n_points if a is not None else 0)
        return best


RULES: list[Rule] = []


def rule(name: str, needs: Sequence[str], needs_history: bool = True):
    """Decorator registering a rule function ``f(rv) -> list[Finding]``."""

    def register(f: Callable[[RunView], list[Finding]]) -> Callable[[RunView], list[Finding]]:
        RULES.append(Rule(name, tuple(needs), f, needs_history))
        return f

    return register

