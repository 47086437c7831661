"""tf.distribute: statistics cover every replica's data and only the chief writes; under
MultiWorkerMirroredStrategy, which Keras 3's fit() does not run, one warning.

Each strategy runs in fresh processes (logical devices and TF_CONFIG must be
set before TensorFlow starts); the parent recomputes step 1 on one device from
the batches the replicas actually received.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

from tests.keras import collect_testlib as lib

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collect_dist_worker.py")
TIMEOUT = 420


def _env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(WORKER))), env.get("PYTHONPATH", "")]
    )
    env.update(extra or {})
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _expected_step_one(batches):
    """Step-1 tensors recomputed on one device from the union of the replicas' batches."""
    w = batches[0]
    x = np.concatenate([b["local_x"] for b in batches])
    y = np.concatenate([b["local_y"] for b in batches])
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(2, name="head"),
    ])
    model.set_weights([w[f"w{i}"] for i in range(4)])
    with tf.GradientTape() as tape:
        h = model.layers[0](x)
        out = model.layers[1](h)
        loss = tf.reduce_mean(tf.square(out - y))
    grads, (dh, dout) = tape.gradient(loss, [model.trainable_variables, [h, out]])
    return x, h.numpy(), out.numpy(), dh.numpy(), dout.numpy(), [g.numpy() for g in grads]


def _check_run(log_dir, batches, replicas):
    x, h, out, dh, dout, grads = _expected_step_one(batches)
    assert len(x) == 16 and sum(int(b["replicas"]) for b in batches[:1]) == replicas
    run = lib.read_run(log_dir)
    assert run["introspect/output/hidden"].steps == [1, 2, 3, 4]
    # All replicas' data: 16 samples, not one replica's 8.
    lib.assert_stats_match(run["introspect/output/hidden"].at(1), h, rtol=1e-5)
    lib.assert_stats_match(run["introspect/output/head"].at(1), out, rtol=1e-5)
    lib.assert_stats_match(run["introspect/output_gradient/head"].at(1), dout, rtol=1e-4,
                           atol=1e-8)
    lib.assert_stats_match(run["introspect/output_gradient/hidden"].at(1), dh, rtol=1e-4,
                           atol=1e-8)
    for name, g in zip(["hidden/kernel", "hidden/bias", "head/kernel", "head/bias"], grads,
                       strict=True):
        lib.assert_stats_match(run[f"introspect/gradient/sequential/{name}"].at(1), g,
                               rtol=1e-4, atol=1e-8)
    loss = run["introspect/metric/loss"]
    assert loss.steps == [1, 2, 3, 4]
    np.testing.assert_allclose(loss.field("value")[0], np.mean(np.square(out - np.concatenate(
        [b["local_y"] for b in batches]))), rtol=1e-5)


def test_mirrored_strategy_two_replicas(tmp_path):
    log_dir = str(tmp_path / "run")
    proc = subprocess.run(
        [sys.executable, WORKER, "mirrored", str(tmp_path), log_dir],
        env=_env(), capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    batch = np.load(tmp_path / "worker0.npz")
    assert int(batch["replicas"]) == 2
    _check_run(log_dir, [batch], replicas=2)


def test_multi_worker_mirrored_strategy_one_message(tmp_path):
    """Keras 3's fit() does not train under MultiWorkerMirroredStrategy (keras#20585): with
    the callback it fails as it does without, after one warning naming the problem and what
    to do instead, and nothing of the callback's in the traceback or on disk."""
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    # Each worker's stderr goes to a file: pipes read one worker after the other can fill up
    # while the other worker waits for its peer.
    logs = [tmp_path / f"worker{i}.err" for i in range(2)]
    for i in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, "multiworker", str(tmp_path), str(tmp_path / f"run{i}")],
            env=_env({"TF_CONFIG": tf_config}), stdout=subprocess.DEVNULL,
            stderr=logs[i].open("w"),
        ))
    try:
        for p in procs:
            p.wait(timeout=TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, err) in enumerate(zip(procs, [log.read_text() for log in logs], strict=True)):
        assert p.returncode == 0, err[-4000:]
        assert "tb_introspect" not in err.replace("tb_introspect:", ""), err[-4000:]
        with open(tmp_path / f"worker{i}.json") as f:
            got = json.load(f)
        assert got["without"] is not None and "PerReplica" in got["without"], got
        assert got["with_callback"] == got["without"], got
        [message] = got["warnings"]
        for words in ("MultiWorkerMirroredStrategy", "keras#20585", "one machine with Mirrored",
                      "DDP or FSDP"):
            assert words in message, message
        assert not [f for f in os.listdir(tmp_path / f"run{i}") if "tfevents" in f]
