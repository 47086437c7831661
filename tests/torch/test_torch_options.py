"""The PyTorch Introspector takes the Keras callback's options and means the same by them:
``layers=`` chooses what is monitored, ``rectifiers=`` names more rectifiers, and a step
whose loss-scaled gradients overflowed is left out of the sum and counted."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts


class Clipped(nn.Module):
    """A custom activation the Introspector cannot know is a rectifier."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0.0, max=6.0)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), Clipped(), nn.Linear(16, 5))


def test_layers_choose_outputs_and_parameters(tmp_path):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Introspector(str(tmp_path), model, opt, layers=["1", "2"]) as intro:
        ts.train(model, opt, ts.batches(4), intro)
    run = ts.read_run(str(tmp_path))
    assert set(ts.by_name(run, "output")) == {"1", "2"}
    assert set(ts.by_name(run, "gradient")) == {"1/weight", "1/bias"}
    assert set(ts.by_name(run, "variable")) == {"1/weight", "1/bias"}


def test_rectifiers_name_a_custom_activation(tmp_path):
    def activity_steps(rectifiers):
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        log_dir = tmp_path / str(rectifiers)
        with Introspector(str(log_dir), model, opt, rectifiers=rectifiers, stats_every=4,
                          overhead=None) as intro:
            ts.train(model, opt, ts.batches(8), intro)
        p = ts.point(ts.by_name(ts.read_run(str(log_dir)), "output")["2"], 8)
        return p["activity_steps"], p["steps"]

    # Named: its activity counts every step (exact dead units); else the statistics steps.
    assert activity_steps("2|9") == (8, 8)
    assert activity_steps(None) == (2, 8)


def test_a_skipped_loss_scaled_step_is_counted_not_summed(tmp_path):
    """``GradScaler`` skips the optimizer step whose gradients overflowed: the gradient sum
    leaves it out, the non-finite slots count its values (the Keras callback's rule)."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    data = ts.batches(4)
    data[2][0][0, 0, 0, 0] = float("inf")
    with Introspector(str(tmp_path), model, opt, grad_scaler=scaler) as intro:
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            intro.step(loss=loss)
        intro.end_epoch()
    g = ts.point(ts.by_name(ts.read_run(str(tmp_path)), "gradient")["1/weight"], 4)
    weight = model[1].weight
    assert g["nan_count"] + g["posinf_count"] + g["neginf_count"] > 0
    # Every other value is the finite sum of the three steps that were applied.
    assert g["finite_count"] == weight.numel()
    assert g["count"] == weight.numel() + g["nan_count"] + g["posinf_count"] + g["neginf_count"]
    assert np.isfinite(g["rms"])
