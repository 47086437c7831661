"""Activation checkpointing counted once: a model whose blocks run under
``torch.utils.checkpoint`` (reentrant and not), with and without gradient accumulation,
and a Hugging Face Llama with ``activation_checkpointing_enable`` (formerly
``gradient_checkpointing_enable``) write the same points as the same training without it,
slot by slot, in all four views and the probes. The recompute in backward fires the
forward hooks again; it must be neither counted nor probed a second time (and, where the
first pass ran under ``no_grad``, the reentrant way, it is the one read)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts
from tests.torch.torch_support import HEADS, LM, VOCAB, WIDTH, lm_loss, tokens

STEPS = 6


def _train(log_dir, model: nn.Module, forward, micro: int = 1) -> None:
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Introspector(log_dir, model, opt, every=2) as intro:
        for batch in tokens(STEPS):
            opt.zero_grad()
            for part in batch.chunk(micro):
                loss = forward(model, part) / micro
                loss.backward()
            opt.step()
            intro.step(loss=loss)


def _points(log_dir) -> dict[tuple[str, str], np.ndarray]:
    """Every written vector, (view, tensor) -> its points; and the probes."""
    run = ts.read_run(str(log_dir))
    out = {(view, s.info.name): np.asarray(s.values) for view, series in run.tensors.items()
           for s in series}
    assert run.probes is not None, "no probes written"
    out[("probes", "")] = np.asarray(run.probes.values)
    return out


def _assert_same(plain: dict, checkpointed: dict) -> None:
    assert plain.keys() == checkpointed.keys()
    views = {view for view, _ in plain}
    assert {"variable", "gradient", "output", "output_gradient"} <= views, views
    for key, want in plain.items():
        np.testing.assert_allclose(checkpointed[key], want, rtol=1e-5, atol=1e-7,
                                   equal_nan=True, err_msg=str(key))


@pytest.mark.parametrize("micro", [1, 2], ids=["one_pass", "accumulated"])
@pytest.mark.parametrize("way", ["non_reentrant", "reentrant"])
def test_checkpointed_blocks_write_what_plain_ones_do(tmp_path, way, micro):
    runs = {}
    for name in (None, way):
        torch.manual_seed(0)
        model = LM(name)
        _train(tmp_path / str(name), model, lm_loss, micro=micro)
        runs[name] = _points(tmp_path / str(name))
    _assert_same(runs[None], runs[way])


def test_hugging_face_gradient_checkpointing(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH,
                                      intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=HEADS, num_key_value_heads=2,
                                      max_position_embeddings=64, attn_implementation="sdpa")

    def loss(model, batch):
        return model(input_ids=batch, labels=batch).loss

    runs = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
        if checkpointed:
            getattr(model, "activation_checkpointing_enable",
                    model.gradient_checkpointing_enable)()
        model.train()
        _train(tmp_path / str(checkpointed), model, loss)
        runs[checkpointed] = _points(tmp_path / str(checkpointed))
    _assert_same(runs[False], runs[True])
