"""Each private Keras/TensorFlow access (``keras/private.py``,
``stats.numeric.in_xla_context``) works on the installed versions (``make test`` runs it
on the newest pins, ``make test-oldest`` on the oldest)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tb_introspect.keras import private  # noqa: E402
from tb_introspect.stats.numeric import in_xla_context  # noqa: E402


def test_xla_context_is_seen_inside_jit_compile_only():
    seen = {}

    @tf.function(jit_compile=True)
    def compiled(x):
        seen["jit"] = in_xla_context()
        return x + 1

    @tf.function
    def plain(x):
        seen["plain"] = in_xla_context()
        return x + 1

    compiled(tf.ones(2))
    plain(tf.ones(2))
    assert seen == {"jit": True, "plain": False}


def test_replica_spec_of_a_per_replica_spec():
    from tensorflow.python.distribute import values

    one = tf.TensorSpec([None, 3], tf.float32)
    assert private.replica_spec(values.PerReplicaSpec(one, one)) == one
    assert private.replica_spec(one) is one


def test_symbolic_build_builds_the_model_metrics_and_optimizer():
    model = keras.Sequential([keras.layers.Dense(2)])
    model.compile("adam", "mse", metrics=["mae"])
    assert not model.built
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 2], tf.float32))
    private.symbolic_build(model, spec)
    assert model.built and model.optimizer.built
    assert private.optimizer_variables(model.optimizer) == list(model.trainable_variables)


def test_keras_masks_are_carried_over():
    masked = keras.layers.Masking(0.0)(tf.constant(np.array([[[0.0], [1.0]]], "float32")))
    assert getattr(masked, "_keras_mask", None) is not None
    copy = private.copy_keras_mask(masked, tf.identity(masked))
    np.testing.assert_array_equal(copy._keras_mask.numpy(), [[False, True]])


def test_instance_attributes_bypass_tracking():
    layer = keras.layers.Dense(2)
    private.set_instance_attr(layer, "call", lambda x: x)
    assert "call" in layer.__dict__
    private.del_instance_attr(layer, "call")
    private.del_instance_attr(layer, "call")  # twice: no error
    assert "call" not in layer.__dict__


def test_functions_called_without_graph_optimization_on_this_thread_only():
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    def meta_optimizer_off() -> bool:
        config = config_pb2.ConfigProto.FromString(
            context.context().function_call_options.config_proto_serialized)
        return config.graph_options.rewrite_options.disable_meta_optimizer

    before = context.context().function_call_options
    with private.without_graph_optimization():
        assert meta_optimizer_off()
        got = tf.function(lambda x: tf.reduce_sum(x * 2.0))(tf.ones(3))
    assert float(got) == 6.0
    assert context.context().function_call_options is before
    assert not meta_optimizer_off()
