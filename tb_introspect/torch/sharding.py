"""Parameters held in pieces by several processes, and the wrappers the tool cannot read.

A ``DTensor`` parameter (FSDP2's ``fully_shard``, tensor parallelism's
``parallelize_module``, both on a 2-D mesh) holds on each process the block its placements
give it: ``Shard(d)`` splits axis ``d`` over a mesh dimension, ``_StridedShard(d, sf)`` too
but in strides (FSDP2 over tensor parallelism: the tensor parallel split comes first, so a
block may not be one run of the whole), ``Replicate()`` gives every process of that mesh
dimension the same block. ``shard`` says which block this process holds, where it sits in the
whole, and whether this copy counts (the first of its replicas), as ``pipeline.params.Shard``;
``local`` is the block itself. A parameter on a mesh of one process is whole.

FSDP1 (``FullyShardedDataParallel``) flattens a module's parameters into one flat parameter
sharded without shapes, and DeepSpeed's ZeRO-3 partitions them the same way: neither says
where an element belongs, so ``unreadable`` names them and the parameter views are off.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn

from tb_introspect.pipeline.params import Shard
from tb_introspect.torch import private


@functools.cache
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without distributed
        return None
    return DTensor


def is_dtensor(t: torch.Tensor) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def local(t: torch.Tensor) -> torch.Tensor:
    """The block of ``t`` this process holds (``t`` itself unless it is a ``DTensor``)."""
    return t.to_local() if is_dtensor(t) else t


def shard(t: torch.Tensor) -> Shard | None:
    """Which block of ``t`` this process holds; None when it holds the whole (not a
    ``DTensor``, or a mesh of one process). Raises ``ValueError`` for a placement the tool
    does not read (``Partial``: values not yet summed over processes)."""
    if not is_dtensor(t) or t.device_mesh.size() == 1:
        return None
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor import Shard as ShardPlacement

    strided = private.strided_shard_type()
    mesh, placements = t.device_mesh, t.placements
    coord = mesh.get_coordinate()
    if coord is None:  # this process is not on the parameter's mesh
        return Shard(tuple(t.shape), (0,) * t.ndim, counts=False)
    # a parameter on a sub-mesh has a copy on each of its sibling sub-meshes
    counts = private.first_copy_on_root_mesh(mesh)
    for dim, pl in enumerate(placements):
        if isinstance(pl, Replicate):
            counts = counts and coord[dim] == 0
        elif isinstance(pl, Partial):
            raise ValueError(f"placement {pl} (values not yet summed over processes)")
        elif not (isinstance(pl, ShardPlacement) or strided and isinstance(pl, strided)):
            raise ValueError(f"placement {pl} (a layout the tool does not read)")
    try:
        index = private.dtensor_positions(t.shape, mesh.shape, coord, placements)
    except (ImportError, AttributeError, TypeError) as e:
        raise ValueError(f"placements {tuple(placements)} (where this process's block sits"
                         f" in the whole, which this PyTorch does not say: {e})") from e
    offset = tuple(ix[0] if ix else 0 for ix in index)
    contiguous = all(tuple(ix) == tuple(range(o, o + len(ix)))
                     for ix, o in zip(index, offset, strict=True))
    return Shard(tuple(int(d) for d in t.shape), offset, counts,
                 None if contiguous else index)


def data_parallel(model: nn.Module) -> bool:
    """Whether ``model`` averages its processes' gradients (DDP, FSDP2's ``fully_shard``):
    each process's loss is then its share of the mean loss."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return True
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def unreadable(names: Sequence[str], params: Sequence[torch.Tensor]) -> str | None:
    """What the tool cannot read of a model's parameters (their ``names``, ``params``): a
    line naming the wrapper, or None."""
    if any("_fsdp_wrapped_module" in n or "_flat_param" in n for n in names):
        return ("FSDP1 (FullyShardedDataParallel) keeps the parameters as flattened shards"
                " that do not say where an element belongs, so the variable and gradient"
                " views are off (layer outputs go on); wrap the model with"
                " torch.distributed.fsdp.fully_shard (FSDP2) to see them")
    if any(hasattr(p, "ds_id") for p in params):
        return ("DeepSpeed ZeRO partitions the parameters and gradients as flat pieces"
                " the tool cannot read, so the variable and gradient views are off (layer"
                " outputs go on)")
    return None
