"""One training process for tests/collect/test_distribute.py (run as a script).

    python collect_dist_worker.py mirrored OUT_DIR LOG_DIR
    TF_CONFIG=... python collect_dist_worker.py multiworker OUT_DIR LOG_DIR

Trains a small MLP with the Introspect callback under the strategy and saves,
for the parent test, the initial weights and the exact batch each local replica
received at step 1.
"""

from __future__ import annotations

import json
import os
import sys

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
        _work_around_keras_multi_worker_bugs(model, strategy)
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


def _work_around_keras_multi_worker_bugs(model, strategy) -> None:
    """Keras 3.x fit() does not run under MultiWorkerMirroredStrategy at all, with or
    without tb_introspect (keras-team/keras#20585, tensorflow/tensorflow#72388, open):

    1. ``_maybe_symbolic_build`` reduces the peeked batch with ``strategy.reduce``,
       which fails on it: we build what it builds from the batch spec and skip it;
    2. ``reduce_per_replica(..., "auto")`` calls ``strategy.reduce("MEAN", v, axis=0)``
       on scalar metric values: we reduce them with ``axis=None``.
    Only these two Keras internals are changed; the train step and fit() loop are Keras'.
    """
    import keras
    from keras.src.backend.tensorflow import trainer

    with strategy.scope():
        model._symbolic_build(data_batch=(tf.TensorSpec([None, 6]), tf.TensorSpec([None, 2])))
    model._maybe_symbolic_build = lambda *args, **kwargs: None
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strat, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strat):
            return keras.tree.map_structure(
                lambda v: strat.reduce("MEAN", v, axis=None), values
            )
        return original(values, strat, reduction)

    trainer.reduce_per_replica = reduce_per_replica


if __name__ == "__main__":
    main(*sys.argv[1:4])
