"""The canonical shape every tensor is seen in: rows, then spatial positions, then channels.

One rule for layer outputs, variables and gradients alike. The last axis is the channel
(unit) axis, so dead rates keep their meaning; spatial and time axes of known sizes are
flattened into one, which leaves the dead rates unchanged. A vector is one row whose
elements are the channels, and a scalar is one channel (a layer output, whose axis 0 is
its batch, gets its unit axis from the collector first).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf


def canonical_shape(shape: Sequence[int | None]) -> tuple[int | None, ...]:
    """The canonical shape (rows unknown) of a tensor of static ``shape``.

    ``[rows, channels]``, or ``[rows, positions, channels]`` when there are axes
    between the first and the last whose sizes are all known. A channel count of 0
    means the channels are unknown and not tracked.
    """
    shape = list(shape)
    rank = len(shape)
    if rank == 0:
        return (None, 1)
    if rank == 1:
        return (None, shape[0] if shape[0] is not None else 0)
    c = shape[-1]
    middle = shape[1:-1]
    if rank >= 3 and c is not None and all(d is not None for d in middle):
        return (None, int(np.prod(middle, dtype=np.int64)), c)
    return (None, c if c is not None else 0)


def as_canonical(x: tf.Tensor, canonical: Sequence[int | None]) -> tf.Tensor:
    """``x`` reshaped to its canonical shape (see ``canonical_shape``)."""
    rank = x.shape.rank
    if rank == 0:
        return tf.reshape(x, [1, 1])
    if rank == 1:
        return x[tf.newaxis]
    if len(canonical) == 3:
        return tf.reshape(x, [tf.shape(x)[0], canonical[1], canonical[2]])
    if canonical[1] == 0:  # unknown channel count: one row per leading index, untracked
        return tf.reshape(x, [tf.shape(x)[0], -1])
    return tf.reshape(x, [-1, canonical[1]])
