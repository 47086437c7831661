"""One training process for tests/keras/test_distribute.py (run as a script).

    python collect_dist_worker.py mirrored OUT_DIR LOG_DIR
    TF_CONFIG=... python collect_dist_worker.py multiworker OUT_DIR LOG_DIR

``mirrored``: trains a small MLP with the Introspect callback and saves, for the parent
test, the initial weights and the exact batch each local replica received at step 1.
``multiworker``: Keras 3's ``fit`` does not train under MultiWorkerMirroredStrategy
(keras-team/keras#20585); the same ``fit`` runs with the callback, then without it, and
the worker saves what each raised and the callback's warnings.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main(mode: str, out_dir: str, log_dir: str) -> None:
    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        task = 0
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

    import keras

    from tb_introspect.keras import Introspect

    rng = np.random.default_rng(100 + task)  # each worker has its own data
    x = rng.normal(size=(32, 6)).astype("float32")
    y = rng.normal(size=(32, 2)).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", name="hidden"),
            keras.layers.Dense(2, name="head"),
        ])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    if mode != "mirrored":
        _multi_worker(model, ds, out_dir, log_dir, task, Introspect)
        return
    initial = model.get_weights()
    first = next(iter(strategy.experimental_distribute_dataset(ds)))
    local_x = [np.asarray(t) for t in strategy.experimental_local_results(first[0])]
    local_y = [np.asarray(t) for t in strategy.experimental_local_results(first[1])]
    history = model.fit(ds, epochs=2, verbose=0, callbacks=[Introspect(log_dir, every=1)])
    np.savez(
        os.path.join(out_dir, f"worker{task}.npz"),
        local_x=np.concatenate(local_x), local_y=np.concatenate(local_y),
        replicas=strategy.num_replicas_in_sync, loss=np.array(history.history["loss"]),
        **{f"w{i}": w for i, w in enumerate(initial)},
    )


def _fit(model, ds, callbacks) -> str | None:
    """What ``fit`` raised (``Type: first line``), or None."""
    try:
        model.fit(ds, epochs=2, verbose=0, callbacks=callbacks)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _multi_worker(model, ds, out_dir, log_dir, task, introspect) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_callback = _fit(model, ds, [introspect(log_dir, every=1)])
    without = _fit(model, ds, [])
    said = [str(w.message) for w in caught if "tb_introspect" in str(w.message)]
    with open(os.path.join(out_dir, f"worker{task}.json"), "w") as f:
        json.dump({"with_callback": with_callback, "without": without, "warnings": said}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
