"""Every private PyTorch access the PyTorch writer side needs, in one place.

Each is a name PyTorch may move in a release; ``tests/torch/test_torch_private.py`` checks
each against the installed version. Where one is missing, the fallback keeps training
correct (at some cost in speed or in what is seen).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def compiled_inner(model: Any) -> Any:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), else None."""
    return getattr(model, "_orig_mod", None)


def scaler_scale(scaler: Any) -> torch.Tensor | None:
    """A ``GradScaler``'s current scale as a device tensor, without a host sync
    (``get_scale()`` returns a Python float, which waits for the device)."""
    return getattr(scaler, "_scale", None)


def add_all(accumulators: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor]) -> None:
    """``accumulators[i] += tensors[i]``, one fused kernel per device and dtype where
    PyTorch has ``_foreach_add_`` (one launch per tensor otherwise)."""
    foreach = getattr(torch, "_foreach_add_", None)
    if foreach is not None:
        foreach(list(accumulators), list(tensors))
        return
    for acc, t in zip(accumulators, tensors, strict=True):
        acc.add_(t)


def dtensor_offset(t: Any) -> tuple[int, ...]:
    """Where a ``DTensor``'s local block starts in the whole tensor, per axis
    (``torch.distributed.tensor._utils.compute_local_shape_and_global_offset``)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return tuple(int(o) for o in offset)
