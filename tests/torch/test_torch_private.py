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
