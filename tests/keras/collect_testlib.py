"""Helpers for the training-side tests: read runs back with TensorBoard's own reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

from tb_introspect import metadata  # noqa: E402


@dataclass
class Series:
    """All points of one tag: plugin data, steps, packed vectors."""

    tag: str
    data: object
    steps: list[int] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)

    def field(self, name: str) -> np.ndarray:
        i = list(self.data.fields).index(name)
        return np.array([v[i] for v in self.vectors])

    def at(self, step: int) -> dict[str, float]:
        k = self.steps.index(step)
        return dict(zip(self.data.fields, self.vectors[k], strict=True))


def read_run(log_dir: str) -> dict[str, Series]:
    """Every tb-introspect tag of a run directory, as TensorBoard's Python loader reads it."""
    acc = event_accumulator.EventAccumulator(
        log_dir, size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    run: dict[str, Series] = {}
    for tag in acc.Tags()["tensors"]:
        meta = acc.SummaryMetadata(tag)
        if meta.plugin_data.plugin_name != metadata.PLUGIN_NAME:
            continue
        series = Series(tag, metadata.parse_plugin_data(meta.plugin_data.content))
        for ev in sorted(acc.Tensors(tag), key=lambda e: e.step):
            series.steps.append(int(ev.step))
            series.vectors.append(tensor_util.make_ndarray(ev.tensor_proto))
        run[tag] = series
    return run


def tags_of(run: dict[str, Series], view: str) -> list[str]:
    prefix = metadata.TAG_PREFIX + view + "/"
    return sorted(t[len(prefix):] for t in run if t.startswith(prefix))


def np_summary(x: np.ndarray) -> dict[str, float]:
    """The exact statistics the tests compare against (finite values)."""
    x = np.asarray(x, np.float64).reshape(-1)
    return {
        "count": x.size,
        "min": x.min(),
        "max": x.max(),
        "mean": x.mean(),
        "l2": float(np.sqrt((x * x).sum())),
    }


def assert_stats_match(got: dict[str, float], x: np.ndarray, rtol: float = 1e-4,
                       atol: float = 1e-7) -> None:
    want = np_summary(x)
    assert got["count"] == want["count"], (got["count"], want["count"])
    for key in ("min", "max", "mean", "l2"):
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)


def on_backend(backend: str, code: str, out: Path) -> subprocess.CompletedProcess:
    """``code`` run in a child process whose Keras is on ``backend`` (Keras picks its backend
    once per process), with ``out`` as its argument; it must exit 0."""
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "KERAS_BACKEND": backend})
    assert r.returncode == 0, r.stderr[-4000:]
    return r
