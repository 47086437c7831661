"""The collection options shared by every writer (Keras callback, ``Introspector``, PyTorch),
validated once. No TensorFlow import here: the PyTorch side uses these options too."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from tb_introspect import schema, slots
from tb_introspect.pipeline import storage

#: Percentile sample bound for tensors summarised once per logged point
#: (variables, gradient aggregates). Cheap at logging time.
DEFAULT_LOG_SAMPLE_SIZE = 2**14
#: Percentile sample bound of the in-step output/output-gradient accumulators.
#: It is paid on every accumulated step, so it is kept small; rank error is
#: about 0.5/sqrt(k) (1.1 percentile points at 2048, one sigma).
DEFAULT_STEP_SAMPLE_SIZE = 2**11
#: With ``every="epoch"``, outputs and output gradients get their full statistics from the
#: first step of the epoch and every ``stats_every``-th step after it; the output view's
#: activity counts still come from every step (``pipeline.governor.Phase``). 8 keeps most of the
#: per-step cost of the two output views off seven steps in eight (docs/benchmarks.md).
DEFAULT_STATS_EVERY = 8
#: The share of the plain step time that the Keras callback may add with ``every="epoch"``
#: (see ``pipeline/governor.py``): 5 %, what TensorBoard's own histogram callback costs.
DEFAULT_OVERHEAD = 0.05

#: ``layers=`` / ``rectifiers=``: a regular expression (full match) or layer names.
LayerNames = str | tuple[str, ...] | None


class OptionArgs(TypedDict, total=False):
    """The keyword options every front-end takes (the Keras callback, both ``Introspector``
    classes), with the same meaning everywhere. In the custom TensorFlow loop the graph
    picks the statistics steps, so ``overhead`` is not one of its options.

    sample_size: percentile sample bound for variables and gradients.
    step_sample_size: percentile sample bound of the in-step output
        accumulators; smaller is faster (rank error ~0.5/sqrt(k)).
    stats_every: with ``every="epoch"``, the statistics of outputs and output
        gradients (moments, extremes, percentiles) come from the epoch's first
        step and at most every ``stats_every``-th step after it (the densest
        cadence the governor may choose); the activity (activation rate, dead
        rates, activity maps) of rectifier outputs counts every row of every
        batch, that of other outputs comes from the statistics steps (it is
        written as sampled). 1 allows every step (slower).
    layers: the layers monitored at all (all four views): a regular
        expression matched against the full layer name (``"conv.*|head"``)
        or a list of names. Default: every layer.
    rectifiers: more layers whose outputs make exact zeros (a custom
        activation), as a regular expression or names; ReLU, ReLU6,
        thresholded ReLU and layers with ``activation="relu"``/``"relu6"`` are
        recognised already.
    overhead: with ``every="epoch"``, the share of the plain step time that
        the statistics may add (default 0.05); None turns the governor off
        (statistics on every ``stats_every``-th step).
    quantiles: percentile points (0..100) recorded.
    flush_secs: longest time logged data waits before it is flushed
        (TensorBoard's live view); epoch ends always flush. Default: 5 s for a
        local directory, 60 s for a bucket URL, where every flush puts one more
        object that a TensorBoard starting on the run reads one by one.
    seed: the samplers' seed (the same data and seed give the same points).
    on_finding: ``"stop"`` or a callable ``f(finding)``, run when a finding of
        at least ``on_finding_severity`` first appears: after each logged
        point the ``tb-introspect diagnose`` rules judge the points written so
        far, on a worker thread; each rule acts once. ``"stop"`` ends training
        (Keras: ``model.stop_training``; a loop: ``FindingStop`` is raised
        after the point is written). A callable that raises warns once and is
        not called again; one that raises ``FindingStop`` stops.
    on_finding_severity: ``"critical"``, ``"warning"`` (default: warnings
        and critical findings) or ``"info"`` (every finding).
    window: with ``every="epoch"``, also close the aggregated window every
        ``window`` steps: a point per window of N steps, aggregated as an
        epoch is (gradients summed over its steps, outputs over its statistics
        steps, rectifiers' activity over every step, activity maps and metric
        bands per window); epoch ends still close a window. None: per epoch.
        Not with ``every=N``, which samples one step in N.
    probes: the transformer probes (layer outputs' median |a| and kurtosis,
        attention logits, the output head's logits; docs/format.md), taken on
        statistics steps wherever attention layers or an output head are
        found. False: none.
    """

    sample_size: int
    step_sample_size: int
    stats_every: int
    quantiles: Sequence[float]
    flush_secs: float | None
    seed: int
    layers: str | Sequence[str] | None
    rectifiers: str | Sequence[str] | None
    overhead: float | None
    on_finding: str | Callable[[Any], None] | None
    on_finding_severity: str
    window: int | None
    probes: bool


@dataclass(frozen=True)
class Options:
    """What to collect and how; build it with ``Options.make`` (which validates)."""

    views: tuple[str, ...] = slots.VIEWS
    every: str | int = "epoch"
    sample_size: int = DEFAULT_LOG_SAMPLE_SIZE
    step_sample_size: int = DEFAULT_STEP_SAMPLE_SIZE
    stats_every: int = DEFAULT_STATS_EVERY
    quantiles: tuple[float, ...] = slots.DEFAULT_QUANTILES
    flush_secs: float | None = None
    seed: int = 0
    layers: LayerNames = None
    rectifiers: LayerNames = None
    overhead: float | None = DEFAULT_OVERHEAD
    on_finding: str | Callable[[Any], None] | None = None
    on_finding_severity: str = "warning"
    window: int | None = None
    probes: bool = True

    @classmethod
    def make(
        cls,
        views: Sequence[str] = slots.VIEWS,
        every: str | int = "epoch",
        sample_size: int = DEFAULT_LOG_SAMPLE_SIZE,
        step_sample_size: int = DEFAULT_STEP_SAMPLE_SIZE,
        quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
        flush_secs: float | None = None,
        seed: int = 0,
        stats_every: int = DEFAULT_STATS_EVERY,
        layers: str | Sequence[str] | None = None,
        rectifiers: str | Sequence[str] | None = None,
        overhead: float | None = DEFAULT_OVERHEAD,
        on_finding: str | Callable[[Any], None] | None = None,
        on_finding_severity: str = "warning",
        window: int | None = None,
        probes: bool = True,
    ) -> Options:
        """Validated options; raises ``ValueError`` naming the bad argument."""
        q = tuple(float(x) for x in quantiles)
        slots.tensor_stats_fields("variable", q)
        every = check_every(every)
        return cls(
            views=check_views(views), every=every, window=check_window(window, every),
            sample_size=check_positive("sample_size", sample_size),
            step_sample_size=check_positive("step_sample_size", step_sample_size),
            stats_every=check_positive("stats_every", stats_every),
            quantiles=q, flush_secs=None if flush_secs is None else float(flush_secs),
            seed=int(seed),
            layers=check_layer_names("layers", layers),
            rectifiers=check_layer_names("rectifiers", rectifiers),
            overhead=check_overhead(overhead),
            on_finding=check_on_finding(on_finding),
            on_finding_severity=check_severity(on_finding_severity),
            probes=check_bool("probes", probes),
        )

    @classmethod
    def of(cls, views: Sequence[str], every: str | int, options: dict[str, Any]) -> Options:
        """Validated options from a front-end's arguments; a ``TypeError`` names an
        unknown keyword."""
        unknown = sorted(set(options) - set(OptionArgs.__annotations__))
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r}; the options are"
                            f" {', '.join(OptionArgs.__annotations__)}")
        return cls.make(views, every, **options)

    def want(self, view: str) -> bool:
        return view in self.views

    @property
    def wants_outputs(self) -> bool:
        return self.want("output") or self.want("output_gradient")


def check_layer_names(name: str, value: str | Sequence[str] | None) -> LayerNames:
    """None, a regular expression (checked now) or a tuple of layer names."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"{name}={value!r} is not a regular expression: {e}") from e
        return value
    names = tuple(value)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{name} must be a regular expression or a non-empty list of layer"
                         f" names, got {value!r}")
    return names


def matches(spec: LayerNames, layer_name: str) -> bool:
    """Whether ``layer_name`` is named by ``spec`` (a full-match pattern or a name list)."""
    if spec is None:
        return False
    if isinstance(spec, str):
        return re.fullmatch(spec, layer_name) is not None
    return layer_name in spec


def check_overhead(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"overhead must be None or a share of the step time in (0, 1],"
                         f" got {value!r}")
    return float(value)


def check_views(views: Sequence[str]) -> tuple[str, ...]:
    views = tuple(views)
    for v in views:
        if v not in slots.VIEWS:
            raise ValueError(f"unknown view {v!r}; expected some of {', '.join(slots.VIEWS)}")
    return views


def check_every(every: str | int) -> str | int:
    if every == "epoch":
        return every
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"every must be 'epoch' or a positive number of steps, got {every!r}")
    return int(every)


def check_window(window: int | None, every: str | int) -> int | None:
    """None, or a positive number of steps, with ``every="epoch"`` only."""
    if window is None:
        return None
    window = check_positive("window", window)
    if every != "epoch":
        raise ValueError(f"window={window} aggregates windows of steps as every='epoch'"
                         f" aggregates epochs; every={every!r} samples one step in {every}:"
                         " give one of the two")
    return window


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_log_dir(log_dir: str) -> str:
    """Create ``log_dir`` and prove it is writable, or raise a clear ``OSError`` now (a
    URL whose file system is not installed: ``ValueError`` naming the package)."""
    log_dir = os.fspath(log_dir)
    probe = os.path.join(log_dir, f".tb_introspect_probe_{uuid.uuid4().hex}")
    if storage.is_url(log_dir):
        storage.open_store(log_dir)  # the missing package's ValueError, as it is
    try:
        if storage.is_url(log_dir):  # s3://, gs://...: whole objects (storage.py)
            storage.probe(log_dir)
        else:
            os.makedirs(log_dir, exist_ok=True)
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
    except Exception as e:
        raise OSError(f"tb_introspect: log_dir {log_dir!r} is not writable: {e}") from e
    return log_dir


def check_on_finding(value: Any) -> Any:
    """None, ``"stop"`` or a callable taking a ``Finding``."""
    if value is None or value == "stop" or callable(value):
        return value
    raise ValueError(f"on_finding must be None, 'stop' or a callable taking a Finding,"
                     f" got {value!r}")


def check_severity(value: Any) -> str:
    """The least severity that acts: ``"critical"``, ``"warning"`` or ``"info"``."""
    if isinstance(value, str) and value in schema.SEVERITIES:
        return value
    raise ValueError(f"on_finding_severity must be one of {', '.join(schema.SEVERITIES)},"
                     f" got {value!r}")
