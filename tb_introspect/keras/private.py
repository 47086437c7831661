"""Every private Keras and TensorFlow access the Keras front-end needs, in one place (the
statistics engine's one, ``stats.numeric.in_xla_context``, lives with the engine).

Each is a name Keras or TensorFlow may move in a release; ``tests/keras/test_private.py`` checks
each against the installed versions (``make test`` and ``make test-oldest`` run it on the
newest and the oldest pins). Where one is missing, the fallback keeps training correct.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras


def replica_spec(spec: Any) -> Any:
    """One replica's spec of a per-replica spec (a distributed iterator's element spec)."""
    values = getattr(spec, "_value_specs", None)
    return values[0] if values else spec


def symbolic_build(model: keras.Model, batch_spec: Any) -> None:
    """Build model, compiled metrics/loss and optimizer now, as Keras does under a strategy
    (without one Keras defers it to the first trace of its train function)."""
    build = getattr(model, "_symbolic_build", None)
    if build is not None:
        build(data_batch=batch_spec)


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The variables an optimizer's ``apply(grads)`` updates when none are passed."""
    return list(getattr(optimizer, "_trainable_variables", None) or [])


def copy_keras_mask(src: Any, dst: Any) -> Any:
    """``dst`` with ``src``'s Keras mask (a probe must not drop a masking layer's mask)."""
    mask = getattr(src, "_keras_mask", None)
    if mask is not None:
        try:
            dst._keras_mask = mask
        except AttributeError:
            pass
    return dst


def set_instance_attr(obj: Any, name: str, value: Any) -> None:
    """Set an instance attribute past Keras/TF attribute tracking (a patched ``call``,
    ``apply`` or ``train_step`` must never end up in a saved model or checkpoint)."""
    object.__setattr__(obj, name, value)


def del_instance_attr(obj: Any, name: str) -> None:
    try:
        object.__delattr__(obj, name)
    except AttributeError:
        pass


@contextlib.contextmanager
def without_graph_optimization() -> Iterator[None]:
    """Functions called in this block (on this thread) skip Grappler's graph optimization:
    for a function that runs rarely, optimizing its graph costs more than it saves. Call such
    a function in the block every time: called under other options, it is instantiated and
    optimized again. Where the eager context's options have moved, the block changes
    nothing."""
    try:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.eager import context

        ctx = context.context()
        saved = ctx.function_call_options
        config = config_pb2.ConfigProto.FromString(saved.config_proto_serialized)
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        options = context.FunctionCallOptions(executor_type=saved.executor_type,
                                              config_proto=config)
    except (ImportError, AttributeError, TypeError):
        yield
        return
    ctx.function_call_options = options
    try:
        yield
    finally:
        ctx.function_call_options = saved


def sublayers(layer: Any) -> list[Any]:
    """A layer's direct sub-layers (a composite layer's own, a model's ``layers``)."""
    flatten = getattr(layer, "_flatten_layers", None)
    if callable(flatten):
        try:
            return list(flatten(include_self=False, recursive=False))
        except TypeError:
            pass
    return list(getattr(layer, "layers", None) or [])


#: ``MultiHeadAttention``'s step from the projected query, key and value and the mask to the
#: attention output, the one place that sees the logits' inputs whichever kernel runs.
ATTENTION_KERNEL = "_compute_attention"


def attention_kernel(layer: Any) -> Any | None:
    """``layer``'s attention step when ``layer`` is a ``MultiHeadAttention`` with Keras's own
    (a subclass that replaced it may compute anything else); None otherwise."""
    mha = keras.layers.MultiHeadAttention
    own = getattr(mha, ATTENTION_KERNEL, None)
    if own is None or not isinstance(layer, mha) or (
            getattr(type(layer), ATTENTION_KERNEL, None) is not own):
        return None
    return getattr(layer, ATTENTION_KERNEL)
