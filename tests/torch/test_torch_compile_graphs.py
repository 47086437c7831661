"""Under ``torch.compile`` the tool adds no graph after warm-up: a compiled transformer
(attention through the fused kernel, whose function the probes otherwise patch) trained
for six windows, at the default cadence and at ``every=N``, compiles nothing after its
first two windows. The ``aot_eager`` backend: Dynamo's graph capture and guards, without
Inductor's C++ build."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts

WINDOW, WINDOWS = 8, 6


def _graphs() -> tuple[int, int]:
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.mark.parametrize("every", ["epoch", 4])
def test_no_graph_after_the_first_two_windows(tmp_path, every):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = ts.LM(None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    by_window = []
    options = {"window": WINDOW} if every == "epoch" else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Introspector(tmp_path, model, opt, every=every, **options) as intro:
            compiled = torch.compile(model, backend="aot_eager")
            for i, batch in enumerate(ts.tokens(WINDOW * WINDOWS)):
                opt.zero_grad()
                loss = ts.lm_loss(compiled, batch)
                loss.backward()
                opt.step()
                intro.step(loss=loss)
                if (i + 1) % WINDOW == 0:
                    by_window.append(_graphs())
    assert by_window[0][0] >= 1
    assert by_window[1:] and all(g[1] == 0 for g in by_window), by_window  # no graph break
    assert all(g == by_window[1] for g in by_window[2:]), by_window
    said = [str(w.message) for w in caught if "torch.compile" in str(w.message)]
    assert len(said) == 1 and "probes" in said[0] and "output_gradient" in said[0], said
    # the views go on: every window has its point
    run = ts.read_run(str(tmp_path))
    qkv = ts.by_name(run, "output")["blocks.0.attn.qkv"]
    assert len(qkv.steps) >= WINDOWS, qkv.steps
