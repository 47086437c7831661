"""Real training runs for the findings tests, logged with the numpy writer.

``train_logged`` trains a Keras model with a custom ``GradientTape`` loop and logs
the four views with :class:`tb_introspect.writer.NumpyWriter`, following the
aggregation the ``Introspect`` callback documents (docs/design.md): per epoch,
variables at the epoch's end, gradients summed over the epoch's steps, outputs
and output gradients merged over every batch of the epoch (here by
concatenation, so dead rates are exact); with ``every=N``, the statistics of
every N-th step. ``update_ratio`` and ``cos_prev`` are filled as the callback
fills them. Statistics are computed once per logged point, which keeps a
20-epoch demo run to seconds on one CPU core; the callback itself is exercised
by ``test_findings_callback.py``.

TensorFlow is imported here, never by the rules.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: Percentile sample bound for the large output tensors (rank error ~0.2 points).
SAMPLE_SIZE = 2**16


@dataclass
class Trained:
    """What a logged training run produced."""

    logdir: str
    steps_per_epoch: int
    losses: np.ndarray  # per-step training loss


def _norm(a: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


def train_logged(
    logdir: str,
    build: Callable[[int], tuple[Any, Any]],
    *,
    epochs: int,
    every: str | int = "epoch",
    views: Sequence[str] = ("variable", "gradient", "output", "output_gradient"),
    batch_size: int = 32,
    seed: int = 0,
    data: Any = None,
    metrics: bool = True,
    validation: bool = False,
    loss: Any = None,
    accuracy: bool = False,
    on_epoch: Callable[[int], None] | None = None,
) -> Trained:
    """Train ``build(total_steps) -> (model, optimizer)`` on the digits; log into ``logdir``.

    ``validation`` logs ``val_loss`` after each epoch (inference mode, on the validation
    split), as the ``Introspect`` callback logs Keras's ``val_*`` values. ``loss`` is a Keras
    loss (default: sparse categorical cross-entropy on probabilities); ``accuracy`` also
    logs ``accuracy`` (and ``val_accuracy``) as Keras's compiled metric would. ``data`` is
    any object with ``x_train, y_train, x_val, y_val``. ``on_epoch(epoch)`` is called after
    each epoch's points are written and flushed (a live reader of the logdir).
    """
    import keras
    import tensorflow as tf

    from tb_introspect.demo.data import load_digits
    from tb_introspect.writer import NumpyWriter

    data = data if data is not None else load_digits(seed=seed)
    n = len(data.x_train)
    steps_per_epoch = math.ceil(n / batch_size)
    keras.utils.set_random_seed(seed)
    model, optimizer = build(epochs * steps_per_epoch)
    # A functional model lists its InputLayer: the data, not a layer that computes.
    layers = [la for la in model.layers if not isinstance(la, keras.layers.InputLayer)]
    monitor = keras.Model(model.inputs, [model.outputs[0], *[la.output for la in layers]])
    variables, var_layer, var_depth = [], [], []
    for depth, layer in enumerate(layers):
        for v in layer.trainable_weights:
            variables.append(v)
            var_layer.append(layer.name)
            var_depth.append(depth)
    optimizer.build(variables)
    loss_fn = loss if loss is not None else keras.losses.SparseCategoricalCrossentropy()

    def acc_of(y, pred) -> float:
        # SparseCategoricalAccuracy's value, in numpy: Keras's metric object costs 10 ms a
        # step in eager ops, more than a small model's step.
        return float(np.mean(np.argmax(np.asarray(pred), axis=-1) == y))
    nv = len(variables)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            outs = monitor(x, training=True)
            loss = loss_fn(y, outs[0])
            if model.losses:  # weight penalties, which Keras adds to the reported loss
                loss = loss + tf.add_n(model.losses)
        grads = tape.gradient(loss, variables + list(outs[1:]))
        # An embedding's gradient comes as IndexedSlices; the statistics need it dense.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        # Zeros, not None, for what the loss does not reach (stop_gradient, unused outputs).
        grads = [g if g is not None else tf.zeros_like(v) if i >= nv else tf.zeros(v.shape, v.dtype)
                 for i, (g, v) in enumerate(zip(grads, variables + list(outs[1:]), strict=True))]
        optimizer.apply(grads[:nv], variables)
        return loss, grads[:nv], outs[1:], grads[nv:], outs[0]

    cadence = "epoch" if every == "epoch" else "step"
    rng = np.random.default_rng(seed)
    w_prev = [v.numpy().copy() for v in variables]
    g_prev: list[np.ndarray] | None = None
    losses: list[float] = []
    step = 0
    with NumpyWriter(logdir) as writer:

        def log_point(at: int, epoch: int, grads, outs, out_grads) -> None:
            nonlocal g_prev
            for i, v in enumerate(variables):
                name = v.path
                if "variable" in views:
                    w = v.numpy()
                    ratio = _norm(w - w_prev[i]) / max(_norm(w), 1e-30)
                    writer.add_tensor_stats(
                        w, at, view="variable", name=name, layer=var_layer[i],
                        depth=var_depth[i], cadence=cadence, epoch=epoch,
                        extras={"update_ratio": ratio},
                    )
                    w_prev[i] = w.copy()
                if "gradient" in views:
                    g = grads[i]
                    cos = math.nan
                    if g_prev is not None:
                        den = _norm(g) * _norm(g_prev[i])
                        dot = float(np.sum(g.astype(np.float64) * g_prev[i]))
                        cos = dot / den if den else math.nan
                    writer.add_tensor_stats(
                        g, at, view="gradient", name=name, layer=var_layer[i],
                        depth=var_depth[i], cadence=cadence, epoch=epoch,
                        extras={"cos_prev": cos},
                    )
            if "gradient" in views:
                g_prev = [g.copy() for g in grads]
            for view, arrays in (("output", outs), ("output_gradient", out_grads)):
                if view not in views:
                    continue
                for j, layer in enumerate(layers):
                    writer.add_tensor_stats(
                        arrays[j], at, view=view, name=layer.name, layer=layer.name, depth=j,
                        cadence=cadence, epoch=epoch, sample_size=SAMPLE_SIZE, seed=at + j,
                    )

        for epoch in range(epochs):
            order = rng.permutation(n)
            g_sum = [np.zeros(v.shape, np.float64) for v in variables]
            outs_acc: list[list[np.ndarray]] = [[] for _ in layers]
            og_acc: list[list[np.ndarray]] = [[] for _ in layers]
            epoch_losses, epoch_acc = [], []
            for b in range(steps_per_epoch):
                idx = order[b * batch_size:(b + 1) * batch_size]
                loss_t, grads, outs, out_grads, pred = train_step(
                    tf.constant(data.x_train[idx]), tf.constant(data.y_train[idx])
                )
                step += 1
                value = float(loss_t)
                losses.append(value)
                epoch_losses.append(value)
                if metrics:
                    writer.add_metric("loss", value, step, epoch=epoch)
                    if accuracy:
                        epoch_acc.append(acc_of(data.y_train[idx], pred))
                        writer.add_metric("accuracy", epoch_acc[-1], step, epoch=epoch)
                grads = [g.numpy() for g in grads]
                outs = [o.numpy() for o in outs]
                out_grads = [
                    og.numpy() if og is not None else np.zeros(o.shape, o.dtype)
                    for og, o in zip(out_grads, outs, strict=True)
                ]
                if cadence == "epoch":
                    for acc, g in zip(g_sum, grads, strict=True):
                        acc += g
                    for j in range(len(layers)):
                        outs_acc[j].append(outs[j])
                        og_acc[j].append(out_grads[j])
                elif step % int(every) == 0:
                    log_point(step, epoch, grads, outs, out_grads)
            if cadence == "epoch":
                log_point(
                    step, epoch, [g.astype(np.float32) for g in g_sum],
                    [np.concatenate(a) for a in outs_acc], [np.concatenate(a) for a in og_acc],
                )
            if metrics:
                writer.add_metric_epoch("loss", epoch_losses, step, epoch=epoch)
                if accuracy:
                    writer.add_metric_epoch("accuracy", epoch_acc, step, epoch=epoch)
            if validation:
                pred = model(tf.constant(data.x_val), training=False)
                writer.add_metric("val_loss", float(loss_fn(data.y_val, pred)), step, epoch=epoch)
                if accuracy:
                    writer.add_metric("val_accuracy", acc_of(data.y_val, pred), step, epoch=epoch)
            if on_epoch is not None:
                writer.flush()
                on_epoch(epoch)
    keras.backend.clear_session()
    return Trained(logdir=logdir, steps_per_epoch=steps_per_epoch, losses=np.array(losses))


def read_one(logdir: str) -> Any:
    """The single run of ``logdir`` as a ``RunSeries``."""
    from tb_introspect.read import read_logdir

    runs = read_logdir(logdir)
    assert len(runs) == 1, sorted(runs)
    return next(iter(runs.values()))


def build_saturated_tanh_mlp(total_steps: int) -> tuple[Any, Any]:
    """Three tanh layers initialised 8x too large: most units start and stay saturated."""
    import keras
    from keras import layers

    init = keras.initializers.RandomNormal(stddev=1.0)  # Glorot would be ~0.15 here
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            layers.Flatten(name="flatten"),
            *[layers.Dense(32, activation="tanh", kernel_initializer=init, name=f"tanh{i}")
              for i in (1, 2, 3)],
            layers.Dense(10, activation="softmax", name="classifier"),
        ],
        name="saturated_tanh_mlp",
    )
    return model, keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)


def build_exploding_mlp(total_steps: int) -> tuple[Any, Any]:
    """A leaky-ReLU MLP (its units cannot die) at a learning rate 30x too high."""
    import keras
    from keras import layers

    model = keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            layers.Flatten(name="flatten"),
            layers.Dense(32, activation="leaky_relu", name="dense1"),
            layers.Dense(32, activation="leaky_relu", name="dense2"),
            layers.Dense(10, activation="softmax", name="classifier"),
        ],
        name="exploding_mlp",
    )
    return model, keras.optimizers.SGD(learning_rate=1.0, momentum=0.9)


def dead_onset(run: Any, finding: Any) -> int:
    """Earliest step where a layer of ``finding`` has its dead rate >= the finding's threshold
    on 2 consecutive points (8-epoch runs: 2 is the rules' "sustained"), from the raw series."""
    from tb_introspect.diagnose.core import first_sustained

    onsets = []
    for s in run.tensors[finding.view]:
        if s.info.tag in finding.tags:
            j = first_sustained(s.field("dead_rate") >= finding.evidence["threshold"], 2)
            if j is not None:
                onsets.append(int(s.steps[j]))
    assert onsets, finding
    return min(onsets)
