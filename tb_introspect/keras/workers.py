"""Which TensorFlow worker writes, and whether reads must be in lockstep."""

from __future__ import annotations

import json
import os

import tensorflow as tf

from tb_introspect.pipeline.failures import warn


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True unless this is a non-chief worker of a multi-worker strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    ext = strategy.extended
    for attr in ("should_save_summary", "should_checkpoint"):
        if hasattr(ext, attr):
            return bool(getattr(ext, attr))
    kind, index = resolver.task_type, resolver.task_id
    return kind == "chief" or (kind == "worker" and index == 0)


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """Whether several workers train together (every read of the collector a collective)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    try:
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    except Exception:
        return False
    return sum(len(v) if isinstance(v, (list, dict)) else 1 for v in spec.values()) > 1


#: The one message under ``MultiWorkerMirroredStrategy``: Keras 3's ``fit`` does not run
#: under it (keras-team/keras#20585), so the callback stays out of the way.
MULTI_WORKER = (
    "Keras 3's fit() does not train under MultiWorkerMirroredStrategy (keras-team/keras#20585:"
    " it stops at the first batch with 'Attempt to convert a value (PerReplica...)', with or"
    " without this callback); the callback stays off under it. Train on one machine with"
    " MirroredStrategy, or use tb_introspect.torch with DDP or FSDP (docs/distributed.md)")


def tf_config_tasks() -> int:
    """How many tasks the ``TF_CONFIG`` environment variable's cluster names (0: none)."""
    try:
        spec = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
        return sum(len(v) if isinstance(v, (list, dict)) else 1 for v in spec.values())
    except (ValueError, AttributeError, TypeError):
        return 0


_multi_worker_warned = False


def warn_multi_worker() -> None:
    """``MULTI_WORKER``, once per process."""
    global _multi_worker_warned
    if not _multi_worker_warned:
        _multi_worker_warned = True
        warn(MULTI_WORKER)
