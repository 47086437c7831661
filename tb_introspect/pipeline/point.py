"""One logged point, from the packed vectors a collector hands over to the summaries written.

A framework's collector computes each view's packed vectors (``docs/format.md``) on its
device and hands them over as ``Block``s of a ``Point``; everything after that is here,
the same for every framework: the ``epoch`` and step-count slots, the non-finite values of
steps the optimizer skipped, the tensor summaries and each view's VIEW_SUMMARY, and the
per-epoch activity maps of the layer outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tb_introspect import metadata, slots, summary_pb
from tb_introspect.pipeline.plan import Monitored, Plan


@dataclass
class Block:
    """One view's packed vectors at a point: ``vectors[i]`` is ``specs[i]``'s."""

    view: str
    specs: list[Monitored]
    vectors: np.ndarray  # [len(specs), slots]


@dataclass
class Point:
    """What a collector hands the host at a logged point."""

    blocks: list[Block] = field(default_factory=list)
    window: int = 0  # steps since the last point
    stats_steps: int = 0  # statistics steps among them
    # Steps that counted the rectifier outputs' activity (None: every step of the window).
    activity_steps: int | None = None
    # Output index -> [count, non-zero count of each channel, of each position]: the
    # window's activity counts of that layer output, summed into the epoch's maps.
    activity: dict[int, np.ndarray] = field(default_factory=dict)
    # [variables, 3]: NaN, +Inf, -Inf values of the gradients of steps the optimizer
    # skipped (loss scaling found an overflow), in the plan's variable order.
    skipped: np.ndarray | None = None
    # Module name -> its ``slots.PROBE_VALUE_FIELDS`` over the window (NaN where a probe
    # does not apply); written as the point's one PROBES summary, nothing when empty.
    probes: dict[str, np.ndarray] = field(default_factory=dict)


def fill(block: Block, plan: Plan, epoch: int, point: Point) -> np.ndarray:
    """``block``'s vectors with the ``epoch`` and step-count slots set and the skipped
    steps' non-finite values counted."""
    q = plan.options.quantiles
    fields = slots.tensor_stats_fields(block.view, q)
    at = {f: i for i, f in enumerate(fields)}
    v = np.array(block.vectors, dtype=np.float64).reshape(len(block.specs), len(fields))
    v[:, at["epoch"]] = epoch
    if "steps" in at:
        v[:, at["steps"]] = point.window
        v[:, at["stats_steps"]] = point.stats_steps
    if "activity_steps" in at:
        exact = np.array([plan.exact_activity(s) for s in block.specs], bool)
        counted = point.window if point.activity_steps is None else point.activity_steps
        v[:, at["activity_steps"]] = np.where(exact, counted, point.stats_steps)
    if block.view == "gradient" and point.skipped is not None and point.skipped.any():
        # Those steps left the sum (it would be Inf); their values are still counted.
        rows = {id(s): i for i, s in enumerate(plan.variables)}
        skipped = point.skipped[[rows[id(s)] for s in block.specs]]
        for j, f in enumerate(slots.NONFINITE_FIELDS):
            v[:, at[f]] += skipped[:, j]
        v[:, at["count"]] += skipped.sum(axis=1)
    return v


def values(plan: Plan, point: Point, epoch: int,
           summaries: summary_pb.ViewSummaries) -> list[summary_pb.Value]:
    """The summary values of one point: a tensor's per written tensor, each view's
    VIEW_SUMMARY and the probes."""
    out: list[summary_pb.Value] = []
    q, cadence = plan.options.quantiles, plan.cadence
    for block in point.blocks:
        if not block.specs:
            continue
        vectors = fill(block, plan, epoch, point)
        for s, vec in zip(block.specs, vectors, strict=True):
            out.append(summaries.tensor_stats(
                vec, view=block.view, name=s.name, layer=s.layer, depth=s.depth,
                shape=s.shape, dtype=s.dtype, cadence=cadence, quantiles=q))
        tags = [metadata.stats_tag(block.view, s.name) for s in block.specs]
        summary = summaries.summary(block.view, tags, vectors, quantiles=q, cadence=cadence)
        if summary is not None:
            out.append(summary)
    if point.probes and plan.options.probes:
        out.append(summaries.probes(point.probes, epoch=epoch, cadence=cadence))
    return out


class EpochActivity:
    """The layer outputs' activity counts summed over an epoch's points, written at its end
    as one ``ACTIVITY_MAP`` per output (per-channel and per-position activation rates)."""

    def __init__(self) -> None:
        self.counts: dict[int, np.ndarray] = {}

    def add(self, activity: dict[int, np.ndarray]) -> None:
        for j, row in activity.items():
            prev = self.counts.get(j)
            self.counts[j] = row.astype(np.float64) if prev is None else prev + row

    def take(self, plan: Plan, widths: dict[int, tuple[int, int]], epoch: int,
             summaries: summary_pb.ViewSummaries) -> list[summary_pb.Value]:
        """The maps of the epoch (``widths[j]``: output ``j``'s channels and positions),
        made by the writer's ``summaries``; the counts start again."""
        counts, self.counts = self.counts, {}
        out = []
        for j, row in sorted(counts.items()):
            spec = plan.outputs[j]
            channels, positions = widths[j]
            count = row[0]
            if count <= 0 or not plan.writes("output", spec) or (
                    channels <= 1 and positions == 0):
                continue
            units = max(positions, 1) * channels
            cnz, snz = row[1:1 + channels], row[1 + channels:1 + channels + positions]
            out.append(summaries.activity(
                cnz * channels / count, snz * max(positions, 1) / count, name=spec.name,
                samples=count / units, epoch=epoch, layer=spec.layer, depth=spec.depth,
                shape=spec.shape))
        return out
