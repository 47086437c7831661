"""The run data model: what tb-introspect logged for a run, as numpy series (no TensorFlow).

``read.provider`` reads a run's summaries into a :class:`RunSeries`: per view, one
:class:`Series` per tensor (a row of packed statistics per logged step, the layout of
``docs/format.md``), and the loss and metrics. :func:`align` puts the tensors of one view on
one step axis as :class:`Aligned` (tensor x step) matrices; the run overview
(``plugin.overview``), the findings rules (``diagnose``) and ``tb-introspect diagnose`` all
compute on those. :func:`probes_of` reads a run's transformer probes (format 4) per row and
field, for the ``./probes`` route and the transformer rules alike. How a statistic gets
here from the training step: ``docs/design.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tb_introspect import loss_field, metadata, slots


@dataclass(frozen=True)
class TagInfo:
    """What a tag's summary metadata says about it (no data points)."""

    tag: str
    kind: str
    version: int
    name: str
    fields: tuple[str, ...]
    view: str = ""
    layer: str = ""
    depth: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = ""
    cadence: str = "step"
    quantiles: tuple[float, ...] = ()
    max_step: int = -1
    max_wall_time: float = 0.0
    #: VIEW_SUMMARY only: the TENSOR_STATS tag of each row of its [rows, fields] matrix.
    rows: tuple[str, ...] = ()
    #: The training loss's metric only: what the loss is (``loss_field.loss_json``), or "".
    loss: str = ""

    @property
    def width(self) -> int:
        """Values in one point: ``fields`` per row of a summary, else one per field."""
        return len(self.fields) * max(len(self.rows), 1)

    def sort_key(self) -> tuple[int, str, str]:
        """Depth order: nearest the input first, then by layer and tensor name."""
        return (self.depth, self.layer, self.name)


@dataclass
class Series:
    """All points of one tag: ``values[i, j]`` is field ``info.fields[j]`` at ``steps[i]``."""

    info: TagInfo
    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {name: i for i, name in enumerate(self.info.fields)}

    def has(self, name: str) -> bool:
        """Whether the tag's layout has field ``name``."""
        return name in self._index

    def field(self, name: str) -> np.ndarray:
        """Column of field ``name`` (float64); all-NaN when the layout lacks it."""
        i = self._index.get(name)
        if i is None:
            return np.full(len(self.steps), np.nan)
        return self.values[:, i]

    @property
    def epochs(self) -> np.ndarray:
        """The ``epoch`` slot of every point (float64, NaN where absent)."""
        return self.field("epoch")

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class RunSeries:
    """Everything tb-introspect logged for one run, as numpy series.

    - ``tensors[view]``: the view's tensor statistics in depth order (views
      with no data are absent);
    - ``metrics[name]``: per-step values (field ``value``);
    - ``metric_epochs[name]``: per-epoch bands (fields ``min, p25, p50, p75,
      max, mean, count``);
    - ``activity[name]``: per-epoch activity maps of layer outputs (fields
      ``epoch, samples, c0.., s0..``);
    - ``skipped``: ``(tag, reason)`` of tags that could not be read.
    """

    run: str
    tensors: dict[str, list[Series]] = field(default_factory=dict)
    metrics: dict[str, Series] = field(default_factory=dict)
    metric_epochs: dict[str, Series] = field(default_factory=dict)
    activity: dict[str, Series] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    format_version: int = 0
    #: The PROBES tag (format 4: one ``[rows, PROBE_FIELDS]`` matrix per point), or None;
    #: :func:`probes_of` reads it per row and field.
    probes: Series | None = None

    @property
    def loss_info(self) -> dict | None:
        """What the training loss is, as the front-end recorded it (``loss_field.parse_loss``:
        task, from_logits, label_smoothing, name), or None when not recorded."""
        for s in (self.metrics.get("loss"), self.metric_epochs.get("loss")):
            if s is not None and s.info.loss:
                return loss_field.parse_loss(s.info.loss)
        return None

    def all_series(self) -> dict[str, Series]:
        """Every readable series of the run by tag."""
        out = {s.info.tag: s for view in self.tensors.values() for s in view}
        out.update({s.info.tag: s for s in self.metrics.values()})
        out.update({s.info.tag: s for s in self.metric_epochs.values()})
        out.update({s.info.tag: s for s in self.activity.values()})
        if self.probes is not None:
            out[self.probes.info.tag] = self.probes
        return out


@dataclass
class Aligned:
    """The tensors of one view as (tensor x step) matrices on the union of their steps.

    Row ``i`` is ``series[i]``, column ``j`` is step ``steps[j]``; a tensor without a
    point at a step is NaN there. Matrices are built per field on first use and cached.
    """

    view: str
    series: list[Series]
    steps: np.ndarray
    #: per column, the largest ``epoch`` slot of the tensors logged there (NaN if none)
    epochs: np.ndarray
    #: ``epoch`` when every tensor was aggregated per epoch, ``window`` when aggregated per
    #: window of steps (some per epoch), else ``step``
    cadence: str = "step"
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _cols: list = field(default_factory=list, repr=False)

    def raw(self, name: str) -> np.ndarray:
        """``m[i, j]`` = field ``name`` of tensor ``i`` at ``steps[j]``; shared, do not modify."""
        return self.raws((name,))[name]

    def raws(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """:meth:`raw` of several fields, built together: one pass over each tensor's
        points for all of them (a field at a time re-reads every tensor, much slower)."""
        names = list(dict.fromkeys(names))
        todo = {n: np.full((len(self.series), len(self.steps)), np.nan)
                for n in names if n not in self._cache}
        if todo:
            if not self._cols:
                self._cols.extend(_columns(s, self.steps) for s in self.series)
            for i, s in enumerate(self.series):
                if len(s):
                    for name, m in todo.items():
                        if s.has(name):
                            m[i, self._cols[i]] = s.field(name)
            self._cache.update(todo)
        return {n: self._cache[n] for n in names}

    def field(self, name: str, finite_only: bool = True) -> np.ndarray:
        """A copy of :meth:`raw`; with ``finite_only``, NaN where the tensor held NaN/Inf.

        Statistics of a broken tensor (a dead rate of 1 because nothing is finite) are
        evidence of nothing but the NaN itself.
        """
        m = self.raw(name).copy()
        if finite_only and name not in slots.NONFINITE_FIELDS:
            m[self.nonfinite_mask()] = np.nan
        return m

    def nonfinite_counts(self) -> np.ndarray:
        """NaN + Inf values each tensor held at each step (0 where not logged)."""
        if "__nonfinite__" not in self._cache:
            self._cache["__nonfinite__"] = sum(
                np.nan_to_num(self.raw(f), nan=0.0) for f in slots.NONFINITE_FIELDS
            )
        return self._cache["__nonfinite__"]

    def nonfinite_mask(self) -> np.ndarray:
        """``True`` where a tensor's statistics count NaN or Inf values."""
        return np.asarray(self.nonfinite_counts() > 0)

    def subset(self, rows: Sequence[int]) -> Aligned:
        """The same view restricted to tensors ``rows`` (same step axis)."""
        return Aligned(self.view, [self.series[i] for i in rows], self.steps, self.epochs,
                       self.cadence)

    @property
    def n_points(self) -> int:
        return len(self.steps)

    @cached_property
    def span(self) -> np.ndarray:
        """Training steps each logged point spans (>= 1), per column."""
        return point_spans(self.steps)

    def tags(self, rows: Iterable[int] | None = None) -> list[str]:
        idx = range(len(self.series)) if rows is None else rows
        return [self.series[i].info.tag for i in idx]

    def layers(self, rows: Iterable[int] | None = None) -> list[str]:
        idx = range(len(self.series)) if rows is None else rows
        return unique([self.series[i].info.layer for i in idx])


def _columns(s: Series, steps: np.ndarray) -> slice | np.ndarray:
    # Most tensors of a view are logged at every step: skip the search for those.
    if len(s) == len(steps) and np.array_equal(s.steps, steps):
        return slice(None)
    return np.searchsorted(steps, s.steps)


def align(view: str, series: Sequence[Series]) -> Aligned:
    """``series`` of ``view`` (empty ones too, as all-NaN rows) on the union of their steps."""
    series = list(series)
    parts = [s.steps for s in series if len(s)]
    steps = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
    cadences = {s.info.cadence for s in series}
    cadence = ("step" if not cadences <= set(metadata.AGGREGATED_CADENCES)
               else "window" if "window" in cadences else "epoch")
    a = Aligned(view, series, steps, np.empty(0), cadence)
    epochs = np.fmax.reduce(a.raw("epoch"), axis=0, initial=-np.inf)
    epochs[np.isneginf(epochs)] = np.nan  # no tensor has an epoch there
    a.epochs = epochs
    return a


#: What :class:`Probes` holds besides ``slots.PROBE_VALUE_FIELDS``: the layer output's
#: max|a| (max(|min|, |max|) of its output packed vector at the probe's step) and the
#: massive-activation ratio max|a| / abs_median.
PROBE_DERIVED_FIELDS: tuple[str, ...] = ("max_abs", "massive_ratio")


@dataclass
class Probes:
    """A run's transformer probes: ``values[f][i, j]`` is field ``f`` of row ``rows[i]`` at
    ``steps[j]`` (NaN where the probe does not apply to the row or the point holds no row
    of that name)."""

    steps: np.ndarray
    epochs: np.ndarray
    rows: tuple[str, ...]
    values: dict[str, np.ndarray]
    cadence: str = "step"

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.values)

    def field(self, name: str) -> np.ndarray:
        """The (rows x points) matrix of field ``name``; shared, do not modify."""
        return self.values[name]

    def rows_with(self, name: str) -> list[int]:
        """Rows where field ``name`` has a finite value at some point."""
        return [int(i) for i in np.flatnonzero(np.isfinite(self.values[name]).any(axis=1))]

    @property
    def n_points(self) -> int:
        return len(self.steps)


def probes_of(run: RunSeries) -> Probes | None:
    """The run's probes per row and field, with the derived ``PROBE_DERIVED_FIELDS``; None
    when the run has none (format 1-3 runs, probes switched off).

    A point whose ``row_key`` of a row is not that of the row's name (another model written
    into the same run directory) is NaN for that row. ``max_abs`` comes from the output
    view's tensor of the same name (or layer) at the same step.
    """
    s = run.probes
    if s is None or not len(s) or not s.info.rows:
        return None
    fields, rows = s.info.fields, s.info.rows
    cube = s.values.reshape(len(s), len(rows), len(fields))
    index = {f: i for i, f in enumerate(fields)}
    if "row_key" in index:
        want = np.array([slots.row_key(r) for r in rows])
        wrong = cube[:, :, index["row_key"]] != want  # (points, rows)
    else:
        wrong = np.zeros(cube.shape[:2], dtype=bool)
    values: dict[str, np.ndarray] = {}
    for f in slots.PROBE_VALUE_FIELDS:
        m = cube[:, :, index[f]].T.copy() if f in index else np.full((len(rows), len(s)), np.nan)
        m[wrong.T] = np.nan
        values[f] = m
    epochs = cube[:, :, index["epoch"]] if "epoch" in index else np.full(cube.shape[:2], np.nan)
    with np.errstate(invalid="ignore"):
        point_epochs = np.fmax.reduce(np.where(wrong, np.nan, epochs), axis=1)
    max_abs = _output_max_abs(run, rows, s.steps)
    med = values["abs_median"]
    with np.errstate(divide="ignore", invalid="ignore"):
        # A median |a| of 0 (a rectifier output more than half zeros) leaves the ratio
        # undefined, not infinite: NaN.
        ratio = np.where(med > 0, max_abs / np.where(med > 0, med, 1.0), np.nan)
    values["max_abs"] = max_abs
    values["massive_ratio"] = ratio
    return Probes(steps=s.steps, epochs=point_epochs, rows=rows, values=values,
                  cadence=s.info.cadence)


def _output_max_abs(run: RunSeries, rows: Sequence[str], steps: np.ndarray) -> np.ndarray:
    """(rows x steps) max(|min|, |max|) of each row's output tensor at ``steps``; NaN where
    the output view has no tensor of the row's name (or layer) or no point at that step."""
    outputs = run.tensors.get("output", [])
    by_name = {s.info.name: s for s in outputs}
    by_layer: dict[str, Series] = {}
    for s in outputs:
        by_layer.setdefault(s.info.layer, s)
    out = np.full((len(rows), len(steps)), np.nan)
    for i, row in enumerate(rows):
        s = by_name.get(row)
        if s is None:
            s = by_layer.get(row)
        if s is None or not len(s):
            continue
        j = np.clip(np.searchsorted(s.steps, steps), 0, len(s) - 1)
        hit = s.steps[j] == steps
        m = np.fmax(np.abs(s.field("min")), np.abs(s.field("max")))[j]
        out[i] = np.where(hit, m, np.nan)
    return out


def point_spans(steps: np.ndarray) -> np.ndarray:
    """Training steps covered by each logged point.

    The first point spans as many steps as the typical later gap (a run that
    resumed at step 10000 must not count 10000 steps), never more than its own
    step number.
    """
    steps = np.asarray(steps, dtype=np.float64)
    if steps.size == 0:
        return steps
    gaps = np.diff(steps)
    first = float(np.median(gaps)) if gaps.size else float(steps[0])
    if steps[0] > 0:
        first = min(first, float(steps[0]))
    return np.maximum(np.concatenate([[first], gaps]), 1.0)


def unique(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, first occurrence order."""
    return list(dict.fromkeys(items))
