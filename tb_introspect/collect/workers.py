"""Which TensorFlow worker writes, and whether reads must be in lockstep."""

from __future__ import annotations

import tensorflow as tf


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
