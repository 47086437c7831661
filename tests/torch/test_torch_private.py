"""Each private PyTorch access of ``tb_introspect/torch/private.py`` against the installed
PyTorch: a release that moves one fails here, not in a user's training."""

from __future__ import annotations

import torch
from torch import nn

from tb_introspect.torch import private


def test_compiled_inner_is_the_wrapped_module():
    model = nn.Linear(3, 2)
    assert private.compiled_inner(torch.compile(model)) is model
    assert private.compiled_inner(model) is None


def test_scaler_scale_is_the_device_scale():
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    scaler.scale(torch.ones(()))  # the scale tensor is made on first use
    scale = private.scaler_scale(scaler)
    assert isinstance(scale, torch.Tensor) and float(scale) == scaler.get_scale() == 256.0


def test_add_all_is_the_fused_kernel():
    assert callable(getattr(torch, "_foreach_add_", None)), "torch._foreach_add_ moved"
    accs = [torch.zeros(3), torch.ones(2, 2)]
    private.add_all(accs, [torch.full((3,), 2.0), torch.ones(2, 2)])
    assert accs[0].tolist() == [2.0] * 3 and accs[1].tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_dtensor_offset_is_where_the_block_sits(tmp_path):
    """``compute_local_shape_and_global_offset`` on a one-rank mesh (the 2-rank blocks'
    offsets are checked by tests/torch/test_torch_fsdp.py's slot-by-slot comparison)."""
    import inspect

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    assert list(inspect.signature(compute_local_shape_and_global_offset).parameters)[:3] == [
        "global_shape", "mesh", "placements"]
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        t = distribute_tensor(torch.arange(12.0).view(4, 3), mesh, [Shard(1)])
        assert private.dtensor_offset(t) == (0, 0)
    finally:
        dist.destroy_process_group()
