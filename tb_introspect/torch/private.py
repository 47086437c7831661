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


def strided_shard_type() -> type | None:
    """``torch.distributed.tensor.placement_types._StridedShard`` (FSDP2 over tensor
    parallelism), else None."""
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        return None
    return _StridedShard


def dtensor_positions(shape: Sequence[int], mesh_shape: Sequence[int], coord: Sequence[int],
                      placements: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    """Per axis of a ``DTensor`` of global ``shape``, the global index of each position of
    the local block held at mesh coordinate ``coord``: a contiguous run under ``Shard``,
    strided under ``_StridedShard`` (FSDP2 over tensor parallelism shards the tensor
    parallel dimension first). The placements apply left to right, each to what the
    previous left, as ``torch.distributed.tensor._utils`` computes offsets
    (``Shard.local_shard_size_and_offset``,
    ``_StridedShard.local_shard_size_and_offset(..., _StridedShardOffsetMode.ALL)``)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard, _StridedShardOffsetMode

    index = [tuple(range(int(n))) for n in shape]
    for mesh_dim, pl in enumerate(placements):
        if isinstance(pl, _StridedShard):
            n, at = pl.local_shard_size_and_offset(len(index[pl.dim]), int(mesh_shape[mesh_dim]),
                                                   int(coord[mesh_dim]),
                                                   _StridedShardOffsetMode.ALL)
            picked = list(at) if n else []
        elif isinstance(pl, Shard):
            n, at = Shard.local_shard_size_and_offset(len(index[pl.dim]),
                                                      int(mesh_shape[mesh_dim]),
                                                      int(coord[mesh_dim]))
            picked = list(range(int(at), int(at) + int(n)))
        else:
            continue
        index[pl.dim] = tuple(index[pl.dim][int(j)] for j in picked)
    return tuple(index)


def first_copy_on_root_mesh(mesh: Any) -> bool:
    """Whether this process holds the first copy of what a sub-mesh of a larger mesh holds
    (``mesh["dp"]`` of a 2-D mesh: each tensor parallel rank holds its own copy of a
    parameter sharded on the data parallel dimension only): True when its coordinate is 0
    on every dimension of the root mesh (``DeviceMesh._get_root_mesh``) that ``mesh`` does
    not span, and where the root mesh is not known."""
    root = getattr(mesh, "_get_root_mesh", lambda: None)()
    if root is None or root is mesh or root.size() == mesh.size():
        return True
    coord = root.get_coordinate()
    if coord is None:
        return False
    ranks = root.mesh
    held = {int(r) for r in mesh.mesh.flatten().tolist()}
    for dim, n in enumerate(ranks.shape):
        if n == 1 or coord[dim] == 0:
            continue
        step = list(coord)
        step[dim] = 0
        if int(ranks[tuple(step)]) not in held:  # ``mesh`` does not span ``dim``
            return False
    return True
