"""The collection options shared by every writer (Keras callback, ``Introspector``, PyTorch),
validated once. No TensorFlow import here: the PyTorch side uses these options too."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tb_introspect import metadata

#: Percentile sample bound for tensors summarised once per logged point
#: (variables, gradient aggregates). Cheap at logging time.
DEFAULT_LOG_SAMPLE_SIZE = 2**14
#: Percentile sample bound of the in-step output/output-gradient accumulators.
#: It is paid on every accumulated step, so it is kept small; rank error is
#: about 0.5/sqrt(k) (1.1 percentile points at 2048, one sigma).
DEFAULT_STEP_SAMPLE_SIZE = 2**11
#: With ``every="epoch"``, outputs and output gradients get their full statistics from the
#: first step of the epoch and every ``stats_every``-th step after it; the output view's
#: activity counts still come from every step (see ``Collector``). 8 keeps most of the
#: per-step cost of the two output views off seven steps in eight (README, "Overhead").
DEFAULT_STATS_EVERY = 8


@dataclass(frozen=True)
class Options:
    """What to collect and how; build it with ``Options.make`` (which validates)."""

    views: tuple[str, ...] = metadata.VIEWS
    every: str | int = "epoch"
    sample_size: int = DEFAULT_LOG_SAMPLE_SIZE
    step_sample_size: int = DEFAULT_STEP_SAMPLE_SIZE
    stats_every: int = DEFAULT_STATS_EVERY
    quantiles: tuple[float, ...] = metadata.DEFAULT_QUANTILES
    flush_secs: float = 5.0
    seed: int = 0

    @classmethod
    def make(
        cls,
        views: Sequence[str] = metadata.VIEWS,
        every: str | int = "epoch",
        sample_size: int = DEFAULT_LOG_SAMPLE_SIZE,
        step_sample_size: int = DEFAULT_STEP_SAMPLE_SIZE,
        quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
        flush_secs: float = 5.0,
        seed: int = 0,
        stats_every: int = DEFAULT_STATS_EVERY,
    ) -> Options:
        """Validated options; raises ``ValueError`` naming the bad argument."""
        q = tuple(float(x) for x in quantiles)
        metadata.tensor_stats_fields("variable", q)
        return cls(
            views=check_views(views), every=check_every(every),
            sample_size=check_positive("sample_size", sample_size),
            step_sample_size=check_positive("step_sample_size", step_sample_size),
            stats_every=check_positive("stats_every", stats_every),
            quantiles=q, flush_secs=float(flush_secs), seed=int(seed),
        )

    def want(self, view: str) -> bool:
        return view in self.views

    @property
    def wants_outputs(self) -> bool:
        return self.want("output") or self.want("output_gradient")


def check_views(views: Sequence[str]) -> tuple[str, ...]:
    views = tuple(views)
    for v in views:
        if v not in metadata.VIEWS:
            raise ValueError(f"unknown view {v!r}; expected some of {', '.join(metadata.VIEWS)}")
    return views


def check_every(every: str | int) -> str | int:
    if every == "epoch":
        return every
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"every must be 'epoch' or a positive number of steps, got {every!r}")
    return int(every)


def check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_log_dir(log_dir: str) -> str:
    """Create ``log_dir`` and prove it is writable, or raise a clear ``OSError`` now."""
    log_dir = os.fspath(log_dir)
    probe = os.path.join(log_dir, f".tb_introspect_probe_{uuid.uuid4().hex}")
    try:
        if "://" in log_dir:  # gs://, s3://: only TensorFlow's file systems reach them
            import tensorflow as tf

            tf.io.gfile.makedirs(log_dir)
            with tf.io.gfile.GFile(probe, "w") as f:
                f.write("ok")
            tf.io.gfile.remove(probe)
        else:
            os.makedirs(log_dir, exist_ok=True)
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
    except Exception as e:
        raise OSError(f"tb_introspect: log_dir {log_dir!r} is not writable: {e}") from e
    return log_dir
