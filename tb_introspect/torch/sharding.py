"""Parameters held in pieces by several processes, and the wrappers the tool cannot read.

A ``DTensor`` parameter (FSDP2's ``fully_shard``, tensor parallelism's
``parallelize_module``) holds on each process the block its placements give it: ``Shard(d)``
splits axis ``d`` over a mesh dimension, ``Replicate()`` gives every process of that mesh
dimension the same block. ``shard`` says which block this process holds, where it sits in the
whole, and whether this copy counts (the first of its replicas), as ``pipeline.params.Shard``;
``local`` is the block itself. A parameter on a mesh of one process is whole.

FSDP1 (``FullyShardedDataParallel``) flattens a module's parameters into one flat parameter
sharded without shapes, and DeepSpeed's ZeRO-3 partitions them the same way: neither says
where an element belongs, so ``unreadable`` names them and the parameter views are off.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tb_introspect.pipeline.params import Shard
from tb_introspect.torch import private


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
    ``DTensor``, or a mesh of one process). Raises ``ValueError`` for a placement whose
    values are not yet summed (``Partial``)."""
    if not is_dtensor(t) or t.device_mesh.size() == 1:
        return None
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as ShardPlacement

    mesh, placements = t.device_mesh, t.placements
    coord = mesh.get_coordinate()
    if coord is None:  # this process is not on the parameter's mesh
        return Shard(tuple(t.shape), (0,) * t.ndim, counts=False)
    counts = True
    for dim, pl in enumerate(placements):
        if isinstance(pl, Replicate):
            counts = counts and coord[dim] == 0
        elif not isinstance(pl, ShardPlacement):
            raise ValueError(f"placement {pl} (a value not yet summed over processes)")
    offset = private.dtensor_offset(t)
    return Shard(tuple(int(d) for d in t.shape), tuple(int(o) for o in offset), counts)


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
