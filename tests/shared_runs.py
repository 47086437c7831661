"""The real trainings that test modules read (trained once per session by the fixtures of
``conftest.py``): the quick demo, by the real console script, and a randomly initialised
keras.applications MobileNetV2 with ``Introspect`` (two epochs of two steps, a point every
step: with ``every=1`` only the statistics train function is compiled, not the lean one, which
took a third of this training)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

#: The console script of this environment (None when the package is not installed).
CLI = shutil.which("tb-introspect", path=os.path.dirname(sys.executable)) or shutil.which(
    "tb-introspect")

#: The keras.applications run, and its training.
APP_RUN = "mobilenetv2"
APP_EPOCHS = 2
APP_SAMPLES = 32
APP_BATCH = 16
APP_EVERY = 1

APP_CODE = """
import sys
import numpy as np, keras
from tb_introspect.keras import Introspect
keras.utils.set_random_seed(0)
model = keras.applications.{name}(weights=None, input_shape=(32, 32, 3), classes=10)
model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(),
              metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.normal(size=({samples}, 32, 32, 3)).astype("float32")
y = rng.integers(0, 10, {samples})
model.fit(x, y, batch_size={batch}, epochs={epochs}, verbose=0,
          callbacks=[Introspect(sys.argv[1], every={every})])
"""


def once(tmp_path_factory: pytest.TempPathFactory, name: str,
         make: Callable[[Path], dict[str, str]]) -> dict[str, str]:
    """``make(root)``'s result, made once per test session: ``make test`` runs several
    pytest-xdist workers, each with its own session; the first to ask makes it, under a file
    lock, in a directory the workers share, and the others wait, then read its JSON."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = tmp_path_factory.getbasetemp().parent  # this run's, above every worker's
    else:
        base = tmp_path_factory.getbasetemp()
    done = base / f"{name}.json"
    with FileLock(str(base / f"{name}.lock")):
        if not done.is_file():
            done.write_text(json.dumps(make(base / name)))
    return json.loads(done.read_text())


@dataclasses.dataclass(frozen=True)
class Trained:
    demo: Path  #: the quick demo's logdir: its four runs and nothing else
    demo_stderr: str  #: what the demo printed (its progress bars)
    app: Path  #: the MobileNetV2 run's directory


def train_shared(root: Path) -> dict[str, str]:
    """The two trainings at once, each in its own process (TensorFlow only there: the test
    process stays light). The demo computes; the MobileNetV2 mostly builds and compiles
    graphs, single-threaded: together they keep two cores busy."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    demo, app = root / "demo", root / "app" / APP_RUN
    mobilenet = APP_CODE.format(name="MobileNetV2", samples=APP_SAMPLES, batch=APP_BATCH,
                                epochs=APP_EPOCHS, every=APP_EVERY)
    jobs = [
        subprocess.Popen([CLI, "demo", "--quick", "--logdir", str(demo)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env),
        subprocess.Popen([sys.executable, "-c", mobilenet, str(app)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env),
    ]
    errs = []
    for job in jobs:
        _, err = job.communicate(timeout=1800)
        assert job.returncode == 0, err[-3000:]
        errs.append(err)
    return {"demo": str(demo), "demo_stderr": errs[0], "app": str(app)}


def link_runs(runs: dict[str, Path], root: Path) -> Path:
    """A logdir ``root`` whose run ``name`` holds hard links to the files of ``runs[name]``
    (closed event files: the links read as copies, for free)."""
    for name, src in runs.items():
        for path in src.rglob("*"):
            if path.is_file():
                dst = root / name / path.relative_to(src)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, dst)
    return root
