"""Runs written straight into a bucket of a real S3 server on 127.0.0.1 (moto's server mode):
a Keras run and a PyTorch run, visible while they train (and a custom loop's), read back by
a real TensorBoard without TensorFlow on ``s3://`` (every route, live reload, and the tab in
headless Chromium); a bucket that cannot be written, or a missing package, refused at
construction; and the network to the server gone mid-training: training finishes with one
warning that counts what was not written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
import warnings

import numpy as np
import pytest

from tests.browser.browser_support import tensorboard
from tests.remote.s3_support import Relay, events, keys, point_steps, s3_server

BUCKET = "tb-runs"
RUNS = f"s3://{BUCKET}/runs"
#: The flush interval of the tests' writers: an upload at most every FLUSH seconds.
FLUSH = 0.2
EPOCHS = 3
STEPS = 4  # per epoch


def wait_for_point(client, prefix: str, step: int, timeout: float = 60.0) -> float:
    """Seconds until the point logged at ``step`` can be read from the bucket."""
    t0 = time.monotonic()
    while step not in point_steps(events(client, BUCKET, prefix)):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"the point at step {step} never reached {prefix}")
        time.sleep(0.05)
    return time.monotonic() - t0


def train_keras(client, log_dir: str) -> list[float]:
    """A tiny Keras fit into ``log_dir``; how long each epoch's point took to show."""
    import keras

    from tb_introspect.keras import Introspect

    prefix = log_dir.removeprefix(f"s3://{BUCKET}/")
    seen: list[float] = []

    class Watch(keras.callbacks.Callback):  # runs after Introspect has logged the epoch
        def on_epoch_end(self, epoch, logs=None):
            seen.append(wait_for_point(client, prefix, (epoch + 1) * STEPS))

    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 8, 6)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=EPOCHS, verbose=0,
              callbacks=[Introspect(log_dir, flush_secs=FLUSH), Watch()])
    return seen


def train_torch(log_dir: str, epochs: int = EPOCHS, after_epoch=None) -> list[float]:
    """A tiny PyTorch loop into ``log_dir``; the loss of every step."""
    import torch

    from tb_introspect.torch import Introspector

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(STEPS * 8, 6), torch.randint(0, 2, (STEPS * 8,))
    losses = []
    with Introspector(log_dir, model, opt, flush_secs=FLUSH) as intro:
        for epoch in range(epochs):
            for i in range(STEPS):
                loss = torch.nn.functional.cross_entropy(model(x[i * 8:(i + 1) * 8]),
                                                         y[i * 8:(i + 1) * 8])
                opt.zero_grad()
                loss.backward()
                opt.step()
                intro.step(loss=loss)
                losses.append(loss.item())
            intro.end_epoch()
            if after_epoch is not None:
                after_epoch(epoch, intro)
    return losses


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(scope="module")
def trained(s3):
    """Both runs, trained once into the bucket; when each point became readable."""
    client = s3.client()
    keras_seen = train_keras(client, f"{RUNS}/keras")
    torch_seen: list[float] = []
    losses = train_torch(f"{RUNS}/torch", after_epoch=lambda e, _: torch_seen.append(
        wait_for_point(client, "runs/torch", (e + 1) * STEPS)))
    return {"keras": keras_seen, "torch": torch_seen, "losses": losses}


@pytest.fixture(scope="module")
def tb(trained):
    with tensorboard(RUNS, wait_runs=2) as server:
        # Loaded as far as the last step of both runs (it reads object by object).
        deadline = time.monotonic() + 60
        while {r["max_step"] for r in server.get_json("runs")["runs"]} != {EPOCHS * STEPS}:
            assert time.monotonic() < deadline, server.get_json("runs")
            time.sleep(0.2)
        yield server


def test_points_are_readable_while_training(s3, trained):
    # Each epoch's point was read from the bucket before the next epoch began (an upload at
    # most every FLUSH seconds, from a thread); how soon is benchmarks' to say, not a test's.
    for run in ("keras", "torch"):
        assert len(trained[run]) == EPOCHS, trained
    client = s3.client()
    for run in ("keras", "torch"):
        evs = events(client, BUCKET, f"runs/{run}/")
        assert point_steps(evs) == [STEPS * (e + 1) for e in range(EPOCHS)]
        # Nothing went up twice: every step's loss is in exactly one object.
        loss_steps = [e.step for e in evs
                      if any(v.tag == "introspect/metric/loss" for v in e.summary.value)]
        assert loss_steps == list(range(1, EPOCHS * STEPS + 1)), run
        names = keys(client, BUCKET, f"runs/{run}/")
        assert len(names) > 2 and all(".tb_introspect_probe_" not in n for n in names), names


def test_tensorboard_without_tensorflow_serves_every_route(tb, trained):
    runs = {r["run"]: r for r in tb.get_json("runs")["runs"]}
    assert set(runs) == {"keras", "torch"}
    for name, run in runs.items():
        assert run["max_step"] == EPOCHS * STEPS and "loss" in run["metrics"], run
        assert all(run["views"][v] > 0 for v in ("variable", "gradient", "output")), run
        q = urllib.parse.quote(name)
        doc = tb.get_json(f"run?run={q}")
        tensor = doc["views"]["gradient"][0]
        assert tensor["last_step"] == EPOCHS * STEPS
        tag = urllib.parse.quote(tensor["tag"])
        s = tb.get_json(f"series?run={q}&tag={tag}&field=rms")["series"][tensor["tag"]]
        assert s["steps"] == [STEPS * (e + 1) for e in range(EPOCHS)]
        assert all(v is not None and v > 0 for v in s["values"]["rms"]), s
        with urllib.request.urlopen(
                tb.plugin_url(f"export?run={q}&tag={tag}&format=csv"), timeout=30) as r:
            assert r.read().decode().count("\n") >= EPOCHS
        out = next(t for t in doc["views"]["output"] if t.get("activity_tag"))
        activity = tb.get_json(f"activity?run={q}&tag={urllib.parse.quote(out['activity_tag'])}")
        assert activity["epochs"] == list(range(EPOCHS)), activity.keys()
        overview = tb.get_json(f"overview?run={q}")
        assert set(overview["views"]) >= {"variable", "gradient", "output"}
        assert "findings" in tb.get_json(f"findings?run={q}")
    # The PyTorch run's losses are the ones the loop computed, step by step.
    loss = tb.get_json("overview?run=torch")["metrics"]["loss"]
    assert loss["steps"] == list(range(1, EPOCHS * STEPS + 1))
    np.testing.assert_allclose(loss["values"], trained["losses"], rtol=1e-6)


def test_tensorboard_follows_new_objects_live(tb):
    """A run that grows while TensorBoard serves the bucket: each new object is read."""
    from tb_introspect.writer import NumpyWriter

    def shown_step() -> int | None:
        runs = {r["run"]: r for r in tb.get_json("runs")["runs"]}
        return runs["live"]["max_step"] if "live" in runs else None

    with NumpyWriter(f"{RUNS}/live", flush_secs=0) as writer:
        for step in (1, 2, 3):
            writer.add_tensor_stats(np.full(8, float(step), "float32"), step,
                                    view="variable", name="w", layer="w")
            writer.flush()
            deadline = time.monotonic() + 60  # TensorBoard reloads every second here
            while shown_step() != step:
                assert time.monotonic() < deadline, (step, shown_step())
                time.sleep(0.1)


@pytest.mark.browser
def test_the_tab_on_a_bucket(tb):
    from playwright.sync_api import sync_playwright

    from tests.browser.browser_session import COLOURED_PIXELS_JS, Session
    from tests.browser.browser_support import launch_chromium

    with sync_playwright() as p:
        browser = launch_chromium(p)
        s = Session(browser, tb)
        try:
            f = s.open("p.introspect.run=torch")
            assert min(f.evaluate(COLOURED_PIXELS_JS, ".chart canvas")) > 100
            assert not s.errors and not s.failed, (s.errors, s.failed)
        finally:
            s.close()
            browser.close()


def test_a_custom_loop_writes_to_the_bucket(s3):
    import keras
    import tensorflow as tf

    from tb_introspect.keras import Introspector

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.1)
    with Introspector(f"s3://{BUCKET}/custom/run", every=1, flush_secs=FLUSH) as intro:
        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            intro.record(variables=model.trainable_variables, gradients=grads,
                         metrics={"loss": loss})

        for _ in range(3):
            train_step(tf.ones((8, 4)), tf.zeros((8, 2)))
            intro.step()
        intro.end_epoch()
    assert point_steps(events(s3.client(), BUCKET, "custom/run/")) == [1, 2, 3]


def test_a_bucket_that_cannot_be_written_is_refused_at_construction(s3):
    import torch

    from tb_introspect.keras import Introspect
    from tb_introspect.torch import Introspector
    from tb_introspect.writer import NumpyWriter

    url = "s3://no-such-bucket/run"
    for make in (lambda: Introspect(url), lambda: NumpyWriter(url),
                 lambda: Introspector(url, torch.nn.Linear(2, 2))):
        with pytest.raises(OSError, match="not writable.*NoSuchBucket"):
            make()
    os.environ["S3_ENDPOINT"] = s3.endpoint.removeprefix("http://")  # TensorFlow's old form
    try:
        with pytest.raises(ValueError, match="must be a URL such as http://"):
            NumpyWriter(f"s3://{BUCKET}/run")
    finally:
        os.environ["S3_ENDPOINT"] = s3.endpoint


def test_a_missing_package_is_named_and_nothing_is_written_locally(tmp_path):
    code = textwrap.dedent("""
        import os, sys, torch
        sys.modules["tensorflow"] = None  # a PyTorch user's machine
        from tb_introspect.torch import Introspector
        from tb_introspect.writer import NumpyWriter
        for make in (lambda: NumpyWriter("gs://bucket/run"),
                     lambda: Introspector("gs://bucket/run", torch.nn.Linear(2, 2))):
            try:
                make()
            except ValueError as e:
                print("refused:", e)
        print("files:", os.listdir("."))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    refused = [ln for ln in out.stdout.splitlines() if ln.startswith("refused:")]
    assert len(refused) == 2, out.stdout + out.stderr[-2000:]
    assert all("pip install 'tb-introspect[gcs]'" in ln for ln in refused), refused
    assert "files: []" in out.stdout


def test_a_server_gone_mid_training_costs_one_warning(s3):
    """The fault: the network to the S3 server goes down after the second epoch's point is
    in the bucket (a relay in between is cut)."""
    reader = s3.client()  # straight to the server: reads what went up before the fault
    relay = Relay(s3.endpoint)
    os.environ["S3_ENDPOINT"] = relay.endpoint
    try:
        def after_epoch(epoch, intro):
            if epoch == 1:
                wait_for_point(reader, "fault/run", 2 * STEPS)
                # Nothing in flight when the network goes: a put cut mid-answer may have
                # landed, and would be both in the bucket and counted as lost. A flush with
                # now=True returns once every put is done, and the loop writes nothing more
                # until this returns.
                intro.pipeline.flush(now=True)
                relay.cut()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = train_torch(f"s3://{BUCKET}/fault/run", epochs=4, after_epoch=after_epoch)
    finally:
        os.environ["S3_ENDPOINT"] = s3.endpoint
    assert len(losses) == 4 * STEPS  # training finished
    ours = [str(w.message) for w in caught if "tb_introspect" in str(w.message)]
    assert len(ours) == 1, ours
    (message,) = ours
    m = re.search(r"the values of (\d+) steps \((\d+) to (\d+)\) were not written", message)
    assert m, message
    count, first, last = map(int, m.groups())
    evs = events(reader, BUCKET, "fault/run/")
    written = sorted({e.step for e in evs if e.summary.value})
    # What went up before the fault still reads; the lost steps come after it, counted.
    assert point_steps(evs)[:2] == [STEPS, 2 * STEPS]
    assert first > max(written) and count == last - first + 1, (message, written)


def test_an_fsspec_url_is_written_and_served_without_tensorflow(tmp_path):
    # file:// takes the path gs:// takes, on both sides: fsspec in the writer, and in a
    # TensorBoard without TensorFlow (gcsfs would stand where fsspec's local one is).
    from tb_introspect import summary_pb
    from tb_introspect.writer import NumpyWriter

    url = f"file://{tmp_path}/runs"
    with NumpyWriter(f"{url}/numpy") as writer:
        for step in (1, 2, 3):
            writer.add_tensor_stats(np.full((4, 4), float(step), "float32"), step,
                                    view="variable", name="dense/kernel", layer="dense")
            writer.add_summary(summary_pb.metric_pb("loss", 1.0 / step), step)
    assert len(list((tmp_path / "runs" / "numpy").iterdir())) >= 2  # the header, the rest
    with tensorboard(url) as server:
        (run,) = server.get_json("runs")["runs"]
        assert run["run"] == "numpy" and run["max_step"] == 3, run
        tag = "introspect/variable/dense/kernel"
        s = server.get_json(f"series?run=numpy&tag={urllib.parse.quote(tag)}&field=mean")
        assert s["series"][tag]["values"]["mean"] == [1.0, 2.0, 3.0]
