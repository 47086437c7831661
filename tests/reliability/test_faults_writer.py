"""Faults on the writer side, on real training processes.

- SIGKILL mid-epoch: a training process (Keras ``fit`` + ``Introspect``) is
  killed with a real SIGKILL; every point the event file holds intact is
  served by a real TensorBoard (both loaders), and everything flushed at the
  last epoch end is among it.
- A full disk mid-run: the child process writes its event file under a
  ``RLIMIT_FSIZE`` lowered mid-training (the kernel then fails writes with
  EFBIG; a limit works as root, where chmod would not stop writes) and, where
  this machine lets us mount one, on a tiny tmpfs that another writer fills
  (ENOSPC). Training must go on exactly as without the tool, with one clear
  warning, and what was written before the fault stays readable.
- NaN explosion: a seeded training that diverges to Inf/NaN mid-run has the
  same per-step losses and weights with and without the tool, and the logged
  statistics count the non-finite values exactly.

Run as a script, this file is the child training process of the first two
tests: ``python test_faults_writer.py kill|disk LOGDIR [...]``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from tb_introspect import metadata, slots  # noqa: E402 - TF-free

HERE = Path(__file__).resolve().parent
STEPS_PER_EPOCH = 10
EPOCHS = 4
METRIC_PREFIX = metadata.TAG_PREFIX + "metric"


# ---------------------------------------------------------------------------- child side


def _child_model(lr: float = 0.05):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu", name="hidden")(inp)
    out = keras.layers.Dense(4, name="head")(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.SGD(lr),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _child_data():
    rng = np.random.default_rng(0)
    n = 32 * STEPS_PER_EPOCH
    return rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 4, n)


def _child_kill(logdir: str, progress: str) -> None:
    """Train slowly, reporting each epoch end and mid-epoch, then wait in the middle of the
    third epoch for the parent to kill us."""
    import keras

    from tb_introspect.keras import Introspect

    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step = 0
            self.epochs = 0

        def _say(self, line: str) -> None:
            with open(progress, "a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            # Time passes in every batch: flush_secs' periodic flushes come due mid-epoch
            # (each one is on disk when its step returns).
            time.sleep(0.05)
            if batch == STEPS_PER_EPOCH // 2:
                self._say(f"mid {self.step}")
                if self.epochs == 2:
                    # Held here until the kill: however slow the parent is to see this line,
                    # the child is still mid-epoch when it dies.
                    deadline = time.monotonic() + 600
                    while time.monotonic() < deadline:
                        time.sleep(0.1)
                    raise SystemExit("the parent never killed this training")

        def on_epoch_end(self, epoch, logs=None):
            # Runs after Introspect's on_epoch_end (callbacks run in list order),
            # which flushes: everything up to this step is in the file now.
            self.epochs += 1
            self._say(f"epoch {epoch} {self.step}")

    x, y = _child_data()
    model = _child_model()
    callback = Introspect(logdir, views=("variable", "gradient"), every=1, flush_secs=0.1)
    model.fit(x, y, batch_size=32, epochs=1000, verbose=0, callbacks=[callback, Progress()])


def _child_disk(root: str, result_path: str, faults: list[str]) -> None:
    """Train once without the tool, then once per fault with it; report what happened."""
    import keras

    from tb_introspect.keras import Introspect

    caught: list[str] = []

    def show(message, category, filename, lineno, file=None, line=None):
        caught.append(f"{category.__name__}: {message}")

    warnings.showwarning = show
    warnings.simplefilter("always")
    # Past RLIMIT_FSIZE the kernel sends SIGXFSZ (default: kill); ignored, the
    # write fails with EFBIG instead, as a full disk fails with ENOSPC.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    x, y = _child_data()

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))

    def fit(callbacks):
        losses = Losses()
        model = _child_model()
        model.fit(x, y, batch_size=32, epochs=EPOCHS, verbose=0,
                  callbacks=[*callbacks, losses])
        return losses.losses, [w.tolist() for w in model.get_weights()]

    results = {"baseline": fit([])[0]}

    class Fault(keras.callbacks.Callback):
        """Makes writes in the run directory fail (placed before Introspect)."""

        def __init__(self, fault: str, run: str):
            super().__init__()
            self.fault, self.run = fault, run
            self.at_step = None
            self.step = 0
            self.intro = None  # the Introspect whose writes fail

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1

        def trigger(self):
            self.at_step = self.step
            # The last epoch's points are written beside the next steps: the fault comes
            # after they are on disk, as it would after a slow epoch.
            self.intro.pipeline.flush()
            # What the run directory holds now; the parent checks it stays readable.
            files = [f for f in os.listdir(self.run) if "tfevents" in f]
            assert len(files) == 1, files
            with open(os.path.join(self.run, files[0]), "rb") as f, \
                    open(os.path.join(root, f"{self.fault}.before"), "wb") as out:
                out.write(f.read())
            if self.fault.startswith("fsize"):
                size = max(os.path.getsize(os.path.join(self.run, f))
                           for f in os.listdir(self.run))
                # Not one byte more than the event file holds now.
                resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
            else:  # fill the tmpfs the run lives on, as another job would
                fd = os.open(os.path.join(os.path.dirname(self.run), "filler"),
                             os.O_WRONLY | os.O_CREAT)
                try:
                    while os.write(fd, b"\0" * 65536):
                        pass
                except OSError:
                    pass
                finally:
                    os.close(fd)

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2 and self.fault != "fsize_late":
                self.trigger()

        def on_epoch_end(self, epoch, logs=None):
            if epoch == EPOCHS - 1 and self.fault == "fsize_late":
                self.trigger()

    for fault in faults:
        run = os.path.join(root, fault, "run")
        caught.clear()
        fault_cb = Fault(fault, run)
        fault_cb.intro = Introspect(run, views=("variable", "gradient"), every=5, flush_secs=0.2)
        try:
            losses, _ = fit([fault_cb, fault_cb.intro])
            error = None
        except Exception as e:  # training must not fail: the parent reports this
            losses, error = None, f"{type(e).__name__}: {e}"
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE,
                               (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        results[fault] = {"losses": losses, "error": error, "warnings": list(caught),
                          "fault_step": fault_cb.at_step}
    with open(result_path, "w") as f:
        json.dump(results, f)


# ---------------------------------------------------------------------------- parent side


def _spawn(*args: str, **kw) -> subprocess.Popen:
    path = [str(HERE.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(path))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                            env=env, **kw)


def _wait_lines(path: Path, proc: subprocess.Popen, pred, timeout: float, err: Path
                ) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if pred(lines):
            return lines
        if proc.poll() is not None:
            raise AssertionError(f"child exited early with {proc.returncode}:\n"
                                 + err.read_text(errors="replace")[-3000:])
        time.sleep(0.05)
    raise AssertionError(f"child made no progress: {lines}")


def test_sigkill_mid_epoch_keeps_everything_flushed(tmp_path):
    from tests.reliability import reliability_testlib as rl

    logdir = tmp_path / "logs"
    run = logdir / "killed"
    progress = tmp_path / "progress.txt"
    err = open(tmp_path / "child.err", "wb")  # noqa: SIM115 - closed below
    proc = _spawn("kill", str(run), str(progress), stderr=err)
    try:
        # Kill in the middle of epoch 2, right after its 6th batch.
        lines = _wait_lines(progress, proc, lambda ls: sum(ln.startswith("epoch") for ln in ls)
                            >= 2 and ls[-1].startswith("mid"), timeout=240,
                            err=tmp_path / "child.err")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    flushed_step = int([ln for ln in lines if ln.startswith("epoch")][-1].split()[2])
    mid_step = int(lines[-1].split()[1])
    assert flushed_step == 2 * STEPS_PER_EPOCH and mid_step > flushed_step

    data = rl.event_file(run).read_bytes()
    records, parsed_to = rl.scan_records(data)
    on_disk = rl.points_in_bytes(data)
    # Each view's summary is written in the same call as its tensors' points: the same steps
    # survived. The routes serve the tensors' own tags, so the check below reads those.
    for view in ("variable", "gradient"):
        summary = set(on_disk.pop(metadata.summary_tag(view)))
        view_steps = set().union(*(on_disk[t] for t in on_disk
                                   if t.startswith(metadata.TAG_PREFIX + view + "/")))
        assert summary == view_steps, view
    stats_tags = [t for t in on_disk if not t.startswith(METRIC_PREFIX)]
    # hidden/kernel, hidden/bias, head/kernel, head/bias x (variable, gradient)
    assert len(stats_tags) == 8, sorted(on_disk)
    for tag in stats_tags:
        steps = set(on_disk[tag])
        # Flushed at the last epoch end: every step up to it (every=1).
        assert set(range(1, flushed_step + 1)) <= steps, (tag, sorted(steps))
        # Periodic flushes (flush_secs=0.1) also kept points of the killed epoch.
        assert max(steps) > flushed_step, (tag, sorted(steps))
    loss = on_disk[metadata.metric_tag("loss")]
    assert set(range(1, flushed_step + 1)) <= set(loss)
    print(f"killed at step ~{mid_step}; file {len(data)} B, {len(records)} intact records,"
          f" {len(data) - parsed_to} trailing bytes of a partial record;"
          f" stats up to step {max(max(on_disk[t]) for t in stats_tags)}")

    # Both loaders serve exactly the points the file holds intact, with their values.
    for load_fast in rl.LOADERS:
        with rl.serve(logdir, load_fast) as tb:
            served = _wait_served(tb, "killed", on_disk)
        for tag, points in on_disk.items():
            assert sorted(served[tag]) == sorted(points), (load_fast, tag)
            fields = _fields_of(tag)
            for step, vec in points.items():
                got = served[tag][step]
                for f, v in zip(fields, vec, strict=True):
                    if f != "epoch":
                        want = float(v) if np.isfinite(v) else None
                        assert got[f] == want, (load_fast, tag, step, f, got[f], want)


def _fields_of(tag: str) -> tuple[str, ...]:
    if tag.startswith(metadata.TAG_PREFIX + "metric_epoch/"):
        return slots.METRIC_EPOCH_FIELDS
    if tag.startswith(metadata.TAG_PREFIX + "metric/"):
        return slots.METRIC_FIELDS
    view = tag[len(metadata.TAG_PREFIX):].split("/")[0]
    return slots.tensor_stats_fields(view)


def _wait_served(tb, run: str, want: dict, timeout: float = 90.0) -> dict:
    """The run's served points, once every tag has as many points as ``want`` says."""
    from tests.reliability import reliability_testlib as rl

    deadline = time.monotonic() + timeout
    while True:
        served = rl.served_points(tb, run)
        if all(len(served.get(t, {})) >= len(p) for t, p in want.items()):
            return served
        if time.monotonic() > deadline:
            return served  # the caller's comparison shows what is missing
        time.sleep(0.5)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_disk_full_mid_run_training_goes_on_with_one_warning(tmp_path):
    from tests.reliability import reliability_testlib as rl

    root = tmp_path / "logs"
    faults = ["fsize", "fsize_late"]
    mounted = _mount_tmpfs(root / "enospc", "1m")
    if mounted:
        faults.append("enospc")
    result = tmp_path / "result.json"
    try:
        proc = _spawn("disk", str(root), str(result), *faults, stderr=subprocess.PIPE)
        _, stderr = proc.communicate(timeout=420)
        assert proc.returncode == 0, stderr.decode(errors="replace")[-3000:]
        results = json.loads(result.read_text())
        kept = {f: rl.points_in_dir(root / f / "run") for f in faults}
        before = {f: rl.points_in_bytes((root / f"{f}.before").read_bytes()) for f in faults}
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(root / "enospc")], timeout=20)
    baseline = results["baseline"]
    assert len(baseline) == EPOCHS * STEPS_PER_EPOCH
    reasons = {"fsize": "File too large", "fsize_late": "File too large",
               "enospc": "No space left on device"}
    for fault in faults:
        r = results[fault]
        # Training went on to the end, exactly as without the tool.
        assert r["error"] is None, (fault, r["error"])
        assert r["losses"] == baseline, fault
        # One warning, one line, that says what failed and why.
        ours = [w for w in r["warnings"] if "tb_introspect" in w]
        assert len(ours) == 1, (fault, ours)
        message = ours[0]
        assert reasons[fault] in message, (fault, message)
        assert "\n" not in message and len(message) < 600, (fault, message)
        # What was written before the fault is still there, value for value.
        points, fault_step = kept[fault], r["fault_step"]
        assert before[fault], fault
        for tag, by_step in before[fault].items():
            assert set(by_step) <= set(points[tag]), (fault, tag)
            for step, vec in by_step.items():
                np.testing.assert_array_equal(points[tag][step], vec)
        if fault != "fsize_late":
            # Faults at the start of epoch 2 follow the flush at the end of epoch 1.
            for tag, by_step in points.items():
                every = 1 if tag.startswith(METRIC_PREFIX + "/") else 5
                if not tag.startswith(METRIC_PREFIX + "_epoch"):
                    assert set(range(every, fault_step + 1, every)) <= set(by_step), (fault, tag)
        loss = points[metadata.metric_tag("loss")]
        print(f"{fault}: fault after step {fault_step}; kept steps up to "
              f"{max(loss)}; warning: {message[:200]}")


# ---------------------------------------------------------------------------- NaN explosion


def test_nan_explosion_same_trajectory_and_counted(tmp_path):
    import keras

    from tb_introspect.keras import Introspect
    from tb_introspect.plugin import overview
    from tb_introspect.read import provider

    rng = np.random.default_rng(1)
    x = rng.normal(size=(32 * 8, 8)).astype("float32") * 4
    y = (x @ rng.normal(size=(8, 2)).astype("float32")) ** 2

    class Record(keras.callbacks.Callback):
        """Per-batch running loss and weights after each batch (read-only)."""

        def __init__(self):
            super().__init__()
            self.losses, self.weights = [], []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))
            self.weights.append({v.path: np.array(v) for v in self.model.trainable_variables})

    def train(extra):
        keras.utils.set_random_seed(3)
        inp = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu", name="hidden")(inp)
        h = keras.layers.Dropout(0.2, name="drop")(h)
        out = keras.layers.Dense(2, name="head")(h)
        model = keras.Model(inp, out)
        # A learning rate far too large: the loss grows, overflows to Inf, then NaN.
        model.compile(keras.optimizers.SGD(2e-3), "mse")
        rec = Record()
        model.fit(x, y, batch_size=32, epochs=4, verbose=0, shuffle=True,
                  callbacks=[*extra, rec])
        return rec

    plain = train([])
    log_dir = tmp_path / "nan"
    tool = train([Introspect(str(log_dir), every=1, flush_secs=60)])
    losses = np.array(plain.losses)
    finite = np.isfinite(losses)
    first_bad = int(np.argmin(finite))
    # The explosion happens mid-run (not at once, not never).
    assert 3 < first_bad < len(losses) - 4 and not finite[first_bad:].any(), losses
    # Bit-identical training with the tool: losses and every weight after every step.
    np.testing.assert_array_equal(np.array(tool.losses), losses)
    for k, (a, b) in enumerate(zip(plain.weights, tool.weights, strict=True)):
        for path in a:
            np.testing.assert_array_equal(a[path], b[path], err_msg=f"step {k + 1} {path}")

    run = provider.read_logdir(str(tmp_path))["nan"]
    assert not run.skipped
    variables = {s.info.name: s for s in run.tensors["variable"]}
    assert len(variables) == 4
    weights_bad = None
    for name, s in variables.items():
        for i, step in enumerate(s.steps):
            w = plain.weights[int(step) - 1][name]  # weights after step `step`
            assert s.field("nan_count")[i] == np.isnan(w).sum(), (name, step)
            assert s.field("posinf_count")[i] == np.isposinf(w).sum(), (name, step)
            assert s.field("neginf_count")[i] == np.isneginf(w).sum(), (name, step)
            assert s.field("finite_count")[i] == np.isfinite(w).sum(), (name, step)
            if not np.isfinite(w).all():
                weights_bad = min(weights_bad or step, step)
    assert weights_bad is not None, "the weights never became non-finite"
    # The overview points at the first non-finite gradient, and counts go on after it.
    ov = overview.compute_overview(run)
    grad = ov["views"]["gradient"]
    first = grad["first_nonfinite"]
    assert first is not None and first["step"] <= weights_bad
    assert all(n > 0 for s, n in zip(grad["steps"], grad["nonfinite"], strict=True)
               if s >= weights_bad + 1)
    assert all(n == 0 for s, n in zip(grad["steps"], grad["nonfinite"], strict=True)
               if s < first["step"])
    # The per-step loss is logged as non-finite exactly where training saw it.
    logged = run.metrics["loss"]
    running_finite = finite[logged.steps - 1]
    assert (np.isfinite(logged.field("value")) == running_finite).all()
    assert metadata.metric_tag("loss") == logged.info.tag
    print(f"loss non-finite from step {first_bad + 1}; weights from step {weights_bad};"
          f" first non-finite gradient at step {first['step']} ({first['tag']})")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))  # the repository: the tests package
    if sys.argv[1] == "kill":
        _child_kill(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "disk":
        _child_disk(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
