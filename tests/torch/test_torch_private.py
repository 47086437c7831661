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


def test_dtensor_positions_are_where_the_block_sits():
    """Every coordinate of a (2, 2) mesh: ``Shard`` blocks are runs, FSDP2 over tensor
    parallelism's ``_StridedShard`` blocks are the right-to-left split (its docstring's
    table), and each block starts where ``_compute_local_shape_and_global_offset`` says
    (the 4-rank blocks are checked by tests/torch/test_torch_fsdp.py's 2-D mesh run)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    strided = private.strided_shard_type()
    assert strided is not None, "torch.distributed.tensor.placement_types._StridedShard moved"
    cases = {
        (Shard(1), Shard(1)): {(0, 0): ((0, 1), (0, 1)), (0, 1): ((0, 1), (2,)),
                               (1, 1): ((0, 1), (4,))},
        (strided(0, split_factor=2), Shard(0)): {
            (0, 0): ((0, 1), (0,)), (0, 1): ((4, 5), (0,)),
            (1, 0): ((2, 3), (0,)), (1, 1): ((6, 7), (0,))},
        (strided(0, split_factor=2), Replicate()): {
            (0, 0): ((0, 1, 4, 5), (0,)), (1, 1): ((2, 3, 6, 7), (0,))},
    }
    shapes = {0: (2, 5), 1: (8, 1), 2: (8, 1)}
    for n, (placements, want) in enumerate(cases.items()):
        for coord, index in want.items():
            got = private.dtensor_positions(shapes[n], (2, 2), coord, placements)
            assert got == index, (placements, coord, got)
            _, offset = _compute_local_shape_and_global_offset(shapes[n], (2, 2), list(coord),
                                                               placements)
            assert tuple(ix[0] for ix in got) == tuple(offset), (placements, coord)


def test_first_copy_on_root_mesh_of_a_whole_mesh(tmp_path):
    """A mesh that is its own root holds the only copy (the sub-meshes' copies are checked
    by tests/torch/test_torch_fsdp.py's 2-D mesh run)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        assert callable(getattr(mesh, "_get_root_mesh", None)), "DeviceMesh._get_root_mesh moved"
        assert mesh["dp"]._get_root_mesh() is mesh
        assert private.first_copy_on_root_mesh(mesh)
        assert private.first_copy_on_root_mesh(mesh["dp"])
    finally:
        dist.destroy_process_group()
