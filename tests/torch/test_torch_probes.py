"""The PyTorch transformer probes (docs/format.md, "Version 4: probes") against a direct
computation on the same batches: a model calling ``F.scaled_dot_product_attention``,
``nn.MultiheadAttention`` (both of its paths), a Hugging Face GPT-2 (its default "sdpa"
attention), the output head's largest logit and logsumexp, the layer outputs' median |a| and
kurtosis; taken on statistics steps only and aggregated over the window as the probes'
contract says (``pipeline/probe_window.py``); ``probes=False`` writes none. The contract's
reduction and the parity with Keras: ``tests/stats/test_probe_parity.py``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tb_introspect import metadata, slots
from tb_introspect.pipeline import probe_window
from tb_introspect.pipeline.governor import Phase
from tb_introspect.torch import Introspector
from tb_introspect.torch.probe_values import logit_peak, query_rows
from tests.keras import collect_testlib as lib

ORIGINAL_SDPA = F.scaled_dot_product_attention
ORIGINAL_MHA = F.multi_head_attention_forward
VOCAB, WIDTH, HEADS, SEQ, BATCH = 128, 32, 4, 16, 4
COLS = {f: i for i, f in enumerate(slots.PROBE_FIELDS)}


# ---------------------------------------------------------------------------- the models


class SelfAttention(nn.Module):
    """Causal self-attention through the fused kernel; keeps its q and k for the test."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=-1))
        self.qk = (q.detach().clone(), k.detach().clone())
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.attn = SelfAttention()
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.attn(self.emb(idx))))


def tokens(steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(steps)]


def lm_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


# ---------------------------------------------------------------------------- direct values


def kurtosis(x: np.ndarray) -> float:
    d = x.astype(np.float64).ravel() - x.mean(dtype=np.float64)
    return float(np.mean(d**4) / np.mean(d**2) ** 2)


def logit_lse(logits: np.ndarray) -> float:
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    top = z.max(axis=1, keepdims=True)
    return float(np.mean(top[:, 0] + np.log(np.exp(z - top).sum(axis=1))))


def attention_max(q: np.ndarray, k: np.ndarray, keep: np.ndarray | None = None,
                  scale: float | None = None) -> float:
    """max |q·kᵀ · scale| over every query row and the kept positions."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    logits = q @ np.swapaxes(k, -1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    a = np.abs(logits)
    return float((a if keep is None else np.where(keep, a, 0.0)).max())


def causal(length: int) -> np.ndarray:
    return np.tril(np.ones((length, length), bool))


def probes_of(log_dir) -> tuple[list[str], list[int], list[np.ndarray]]:
    run = lib.read_run(str(log_dir))
    series = run.get(metadata.probes_tag())
    if series is None:
        return [], [], []
    assert series.data.kind == metadata.PROBES
    return list(series.data.rows), series.steps, series.vectors


def value(rows: list[str], matrix: np.ndarray, row: str, field: str) -> float:
    return float(matrix[rows.index(row), COLS[field]])


# ---------------------------------------------------------------------------- SDPA model


@pytest.fixture(scope="module")
def sdpa_run(tmp_path_factory):
    """TinyLM for 2 epochs of 6 steps, statistics every 3rd step (the governor off); each
    step's direct values and whether it was a statistics step."""
    torch.manual_seed(0)
    log_dir = tmp_path_factory.mktemp("probes_sdpa")
    model = TinyLM()
    with torch.no_grad():
        model.attn.qkv.weight[:WIDTH] *= 4.0  # logits of a few tens: not a trivial max
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seen: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: seen.__setitem__(n, o.detach()))
               for n, m in model.named_modules() if n in ("emb", "ln", "head")]
    steps, patched_on_lean = [], []
    with Introspector(log_dir, model, opt, every="epoch", stats_every=3, overhead=None,
                      criterion=nn.CrossEntropyLoss()) as intro:
        for _epoch in range(2):
            for idx in tokens(6):
                stats = intro.phase is Phase.STATS
                if not stats:
                    patched_on_lean.append(F.scaled_dot_product_attention is not ORIGINAL_SDPA)
                logits = model(idx[:, :-1])
                loss = lm_loss(logits, idx)
                opt.zero_grad()
                loss.backward()
                opt.step()
                intro.step(loss=loss)
                q, k = model.attn.qk
                steps.append({
                    "stats": stats,
                    "attn": attention_max(q.numpy(), k.numpy(), causal(SEQ)),
                    "logit_max": float(logits.detach().max()),
                    "lse": logit_lse(logits.detach().numpy()),
                    **{f"{n}/{f}": fn(seen[n].numpy()) for n in ("emb", "ln", "head")
                       for f, fn in (("abs_median", probe_window.abs_median),
                                     ("kurtosis", kurtosis))},
                })
            intro.end_epoch()
    for h in handles:
        h.remove()
    return probes_of(log_dir), steps, patched_on_lean


def test_sdpa_model_probes_per_window(sdpa_run):
    (rows, points, matrices), steps, _ = sdpa_run
    assert points == [6, 12]
    assert set(rows) == {"emb", "attn", "attn.qkv", "attn.proj", "ln", "head"}
    for epoch, matrix in enumerate(matrices):
        window = [s for s in steps[6 * epoch:6 * (epoch + 1)] if s["stats"]]
        assert len(window) == 2  # the epoch's first step, then every 3rd
        np.testing.assert_array_equal(matrix[:, COLS["epoch"]], epoch)
        np.testing.assert_array_equal(matrix[:, COLS["row_key"]],
                                      [slots.row_key(r) for r in rows])
        # maxima over the window's statistics steps, means of the others
        for field, key in (("attn_logit_max", "attn"), ("logit_max", "logit_max")):
            row = "attn" if field == "attn_logit_max" else "head"
            np.testing.assert_allclose(value(rows, matrix, row, field),
                                       max(s[key] for s in window), rtol=1e-4)
        np.testing.assert_allclose(value(rows, matrix, "head", "logit_lse"),
                                   np.mean([s["lse"] for s in window]), rtol=1e-4)
        for name in ("emb", "ln", "head"):
            np.testing.assert_allclose(value(rows, matrix, name, "kurtosis"),
                                       np.mean([s[f"{name}/kurtosis"] for s in window]),
                                       rtol=1e-3)
            # emb and ln hold 2048 values (all of them are the sample): exact; the head's
            # 8192 are sampled (4096 draws: the median within a few percent)
            np.testing.assert_allclose(value(rows, matrix, name, "abs_median"),
                                       np.mean([s[f"{name}/abs_median"] for s in window]),
                                       rtol=1e-4 if name != "head" else 0.08)
        assert value(rows, matrix, "attn", "attn_logit_max") > 5.0
        # a probe that does not apply to a row is NaN
        assert math.isnan(value(rows, matrix, "attn", "kurtosis"))
        assert math.isnan(value(rows, matrix, "ln", "logit_max"))


def test_probes_only_on_statistics_steps(sdpa_run):
    (rows, _, matrices), steps, patched_on_lean = sdpa_run
    # The kernel is patched on statistics steps only...
    assert patched_on_lean and not any(patched_on_lean)
    assert F.scaled_dot_product_attention is ORIGINAL_SDPA  # and given back at close
    assert F.multi_head_attention_forward is ORIGINAL_MHA
    # ... and a lean step's values would move the window's maximum and means: check that
    # the point differs from what every step together gives, where they differ.
    everything = max(s["attn"] for s in steps[:6])
    stats_only = max(s["attn"] for s in steps[:6] if s["stats"])
    got = value(rows, matrices[0], "attn", "attn_logit_max")
    assert stats_only == pytest.approx(got, rel=1e-4)
    if everything > stats_only * 1.001:
        assert got < everything


def test_probes_false_writes_none(tmp_path):
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Introspector(tmp_path, model, opt, every=1, probes=False) as intro:
        for idx in tokens(2):
            assert F.scaled_dot_product_attention is ORIGINAL_SDPA
            loss = lm_loss(model(idx[:, :-1]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            intro.step(loss=loss)
    run = lib.read_run(str(tmp_path))
    assert metadata.probes_tag() not in run
    assert any(t.startswith("introspect/output/") for t in run)  # the views are written


def test_no_head_no_attention_no_probes(tmp_path):
    """A model whose last Linear does not make its output (a softmax after it) and with no
    attention has no probes at all, and says nothing failed."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4), nn.Softmax(-1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Introspector(tmp_path, model, opt, every=1) as intro:
            for _ in range(2):
                loss = model(torch.randn(16, 8)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                intro.step(loss=loss)
    assert not [str(w.message) for w in said if "failed" in str(w.message)]
    assert metadata.probes_tag() not in lib.read_run(str(tmp_path))


# ---------------------------------------------------------------------------- MultiheadAttention


class MHAModel(nn.Module):
    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.mha = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.need_weights = need_weights

    def forward(self, idx: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        self.x = x.detach().clone()
        mask = torch.triu(torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool), 1)
        y, _ = self.mha(x, x, x, attn_mask=mask, key_padding_mask=pad,
                        need_weights=self.need_weights)
        return self.head(y)


def mha_direct(model: MHAModel, pad: np.ndarray) -> tuple[float, float]:
    """The largest logit of nn.MultiheadAttention from its in-projection, in numpy: with
    its masks, and with the causal mask alone."""
    w = model.mha.in_proj_weight.detach().numpy().astype(np.float64)
    b = model.mha.in_proj_bias.detach().numpy().astype(np.float64)
    x = model.x.numpy().astype(np.float64)
    n, t, c = x.shape
    q, k = ((x @ w[i * c:(i + 1) * c].T + b[i * c:(i + 1) * c])
            .reshape(n, t, HEADS, c // HEADS).transpose(0, 2, 1, 3) for i in (0, 1))
    keep = causal(t)[None, None] & ~pad[:, None, None, :]
    return attention_max(q, k, keep), attention_max(q, k, causal(t)[None, None])


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention(tmp_path, need_weights):
    """Both paths of nn.MultiheadAttention: the weights made in it (need_weights=True) and
    its call of the fused kernel (need_weights=False), with a causal and a padding mask."""
    torch.manual_seed(3)
    model = MHAModel(need_weights)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pad = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    pad[:2, -10:] = True  # two sequences are padded: those keys are left out
    direct = []
    with Introspector(tmp_path, model, opt, every=1) as intro:
        for idx in tokens(2, seed=1):
            logits = model(idx[:, :-1], pad)
            direct.append(mha_direct(model, pad.numpy()))  # the weights of this forward
            loss = lm_loss(logits, idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            intro.step(loss=loss)
    rows, points, matrices = probes_of(tmp_path)
    assert points == [1, 2] and "mha" in rows
    got = [value(rows, m, "mha", "attn_logit_max") for m in matrices]
    np.testing.assert_allclose(got, [masked for masked, _ in direct], rtol=1e-4)
    assert got[0] < 0.9 * direct[0][1]  # the padded keys hold the largest logit: left out
    assert F.multi_head_attention_forward is ORIGINAL_MHA


# ---------------------------------------------------------------------------- GPT-2


def test_hf_gpt2_probes(tmp_path):
    """A tiny GPT-2 (built from its config, no download) in its default "sdpa" attention:
    each block's attention row and the LM head's logits against a direct computation."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                     n_positions=SEQ + 1, bos_token_id=0, eos_token_id=0,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    assert model.config._attn_implementation == "sdpa"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hidden: dict[str, torch.Tensor] = {}
    blocks = [f"transformer.h.{i}.attn" for i in range(2)]
    handles = [model.get_submodule(n).register_forward_pre_hook(
        lambda m, args, kwargs, n=n: hidden.__setitem__(
            n, (args[0] if args else kwargs["hidden_states"]).detach().clone()),
        with_kwargs=True) for n in blocks]
    direct = []
    with Introspector(tmp_path, model, opt, every=1) as intro:
        for idx in tokens(2):
            out = model(idx, labels=idx)
            step = {"logit_max": float(out.logits.max()),
                    "lse": logit_lse(out.logits.detach().numpy())}
            for n in blocks:
                attn = model.get_submodule(n)
                qkv = attn.c_attn(hidden[n]).detach().numpy()
                q, k = (qkv[..., i * 32:(i + 1) * 32].reshape(BATCH, SEQ + 1, 2, 16)
                        .transpose(0, 2, 1, 3) for i in (0, 1))
                step[n] = attention_max(q, k, causal(SEQ + 1))
            direct.append(step)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            intro.step(loss=out.loss)
    for h in handles:
        h.remove()
    rows, points, matrices = probes_of(tmp_path)
    assert points == [1, 2]
    assert set(blocks) | {"lm_head"} <= set(rows)
    for matrix, step in zip(matrices, direct, strict=True):
        for n in blocks:
            np.testing.assert_allclose(value(rows, matrix, n, "attn_logit_max"), step[n],
                                       rtol=1e-4)
        np.testing.assert_allclose(value(rows, matrix, "lm_head", "logit_max"),
                                   step["logit_max"], rtol=1e-4)
        np.testing.assert_allclose(value(rows, matrix, "lm_head", "logit_lse"), step["lse"],
                                   rtol=1e-4)
        # every leaf output has its median |a| and kurtosis
        ln = rows.index("transformer.ln_f")
        assert np.isfinite(matrix[ln, COLS["kurtosis"]]) and matrix[ln, COLS["abs_median"]] > 0


# ---------------------------------------------------------------------------- the kernel's sample


def test_logit_peak_samples_query_rows_and_applies_masks():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 200, 8, generator=g), torch.randn(2, 3, 150, 8, generator=g)
    rows = query_rows(200).numpy()
    assert len(rows) == 64 and rows[0] == 0 and rows[-1] == 199
    np.testing.assert_array_equal(rows, probe_window.query_rows(200))
    keep = np.random.default_rng(0).random((2, 1, 200, 150)) > 0.3
    bias = np.where(keep, 0.5, -np.inf).astype(np.float32)
    for masks, expect_keep, add in (((torch.from_numpy(keep),), keep, 0.0),
                                    ((torch.from_numpy(bias),), keep, 0.5)):
        got = float(logit_peak(q, k, masks, scale=0.3))
        ref = (q.double() @ k.double().transpose(-1, -2)).numpy() * 0.3 + add
        ref = np.where(expect_keep, np.abs(ref), 0.0)
        assert got == pytest.approx(ref[:, :, rows].max(), rel=1e-5)
        assert got <= ref.max() + 1e-6
    causal_got = float(logit_peak(q[..., :150, :], k, is_causal=True))
    ref = np.abs((q[..., :150, :].double() @ k.double().transpose(-1, -2)).numpy()
                 / math.sqrt(8))
    sampled = query_rows(150).numpy()
    assert causal_got == pytest.approx(
        np.where(causal(150), ref, 0.0)[:, :, sampled].max(), rel=1e-5)


# ---------------------------------------------------------------------------- HF Trainer


def test_hf_trainer_runs_write_probe_rows(tmp_path):
    """``IntrospectCallback`` drives the same Introspector: a Trainer run of the tiny GPT-2
    (its LM head from ``get_output_embeddings``) and of the tiny BERT classifier (its last
    Linear, the model's logits) write each attention layer's and the head's rows."""
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from tb_introspect.transformers import IntrospectCallback
    from tests.trainers import hf_support as hs

    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(
        vocab_size=hs.VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=hs.SEQ, num_labels=hs.BERT_CLASSES,
        type_vocab_size=1))
    for name, model, data, attention, head in (
            ("gpt2", hs.gpt2(), hs.lm_data(32, 0), "transformer.h.1.attn", "lm_head"),
            ("bert", bert, hs.cls_data(32, 0), "bert.encoder.layer.0.attention.self",
             "classifier")):
        args = TrainingArguments(str(tmp_path / name), max_steps=4, per_device_train_batch_size=8,
                                 logging_steps=2, save_strategy="no", report_to="none",
                                 use_cpu=True, disable_tqdm=True, seed=0)
        Trainer(model=model, args=args, train_dataset=data,
                callbacks=[IntrospectCallback(tmp_path / name / "tb", every=2)]).train()
        rows, points, matrices = probes_of(tmp_path / name / "tb")
        assert points == [2, 4], name
        assert attention in rows and head in rows, rows
        for matrix in matrices:
            assert value(rows, matrix, attention, "attn_logit_max") > 0
            assert np.isfinite(value(rows, matrix, head, "logit_max"))
            assert np.isfinite(value(rows, matrix, head, "logit_lse"))


def test_two_introspectors_at_once(tmp_path):
    """Two models trained side by side, each with its Introspector (a teacher and a student,
    a benchmark's copies): each call is its own model's, and the kernels come back whole."""
    torch.manual_seed(0)
    models = [MHAModel(need_weights=False), TinyLM()]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    pad = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    intros = [Introspector(tmp_path / str(i), m, o, every=1)
              for i, (m, o) in enumerate(zip(models, opts, strict=True))]
    for idx in tokens(2):
        for model, opt, intro in zip(models, opts, intros, strict=True):
            args = (idx[:, :-1], pad) if isinstance(model, MHAModel) else (idx[:, :-1],)
            loss = lm_loss(model(*args), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            intro.step(loss=loss)
    for intro in intros:
        intro.close()
    assert F.scaled_dot_product_attention is ORIGINAL_SDPA
    assert F.multi_head_attention_forward is ORIGINAL_MHA
    (rows0, points0, m0), (rows1, points1, m1) = (probes_of(tmp_path / str(i)) for i in (0, 1))
    assert points0 == points1 == [1, 2]
    assert "mha" in rows0 and "attn" not in rows0
    assert "attn" in rows1 and "mha" not in rows1
    assert all(value(rows0, m, "mha", "attn_logit_max") > 0 for m in m0)
    assert all(value(rows1, m, "attn", "attn_logit_max") > 0 for m in m1)
