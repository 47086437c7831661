"""What a Keras model has to capture, learnt before the first step: its layers' outputs, by
tracing one forward pass that runs nothing (``discover_outputs``), and the batch spec that
trace takes."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tb_introspect.keras import capture, private
from tb_introspect.pipeline.failures import Part, warn
from tb_introspect.pipeline.plan import Monitored, sanitize


class Discovery:
    """Recorder used while tracing the forward pass once to learn what there is to capture."""

    def __init__(self) -> None:
        self.specs: list[Monitored] = []
        self.first_index: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.skipped: list[str] = []

    def fail(self, part: Part, error: BaseException) -> None:
        warn(f"{part}: not monitored ({type(error).__name__}: {error})")

    def layer_output(self, name: str, outputs: Any) -> Any:
        count = self.calls.get(name, 0)
        self.calls[name] = count + 1
        base = name if count == 0 else f"{name}@{count}"
        self.first_index.setdefault(name, len(self.specs))
        new = []
        for leaf_name, leaf in capture.leaves_with_names(base, outputs):
            if not capture.capturable(leaf):
                if leaf is not None and not isinstance(leaf, (int, float, bool, str)):
                    self.skipped.append(leaf_name)
                new.append(leaf)
                continue
            # has_grad: learnt from the statistics step's own backward pass (_check_trace)
            self.specs.append(Monitored(
                view="output", name=sanitize(leaf_name), layer=name, depth=0,
                shape=tuple(leaf.shape.as_list()), dtype=leaf.dtype.name, has_grad=False,
            ))
            new.append(leaf)
        return capture.replace_leaves(outputs, new)


def batch_spec(iterator: Any) -> Any:
    """One replica's spec of a batch (x, y, sample_weight structure) from Keras' iterator."""
    return tf.nest.map_structure(private.replica_spec, iterator.element_spec)


def any_batch(spec: Any) -> Any:
    """The spec with an unknown batch size (batches differ: last one, per replica)."""
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
        return tf.TensorSpec([None] + spec.shape.as_list()[1:], spec.dtype, spec.name)
    return spec


def discover_outputs(model: keras.Model, x_spec: Any) -> Discovery:
    """Trace ``model(x, training=True)`` once (nothing runs): the outputs there are to
    capture. Which of them a gradient reaches, the statistics step's trace tells: a
    backward pass here as well cost MobileNetV2 2 of its 4 CPU-seconds of discovery."""
    discovery = Discovery()

    def forward(x):
        with capture.recording(discovery):
            model(x, training=True)
        return tf.constant(0)

    tf.function(forward, autograph=False).get_concrete_function(
        tf.nest.map_structure(lambda s: s, x_spec)
    )
    return discovery
