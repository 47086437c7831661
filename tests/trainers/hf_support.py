"""The Hugging Face trainings the trainer tests read: a tiny GPT-2 and a tiny BERT
classifier, built from configs (no download), trained on generated tokens with
``IntrospectCallback`` beside ``report_to="tensorboard"``.

``transformers`` is imported where it is used: every pytest worker imports this module when it
collects the tests, and only the one that trains needs it (seconds of import each).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from typing import TYPE_CHECKING  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB, SEQ = 128, 16
EPOCHS = 3
BATCH, ACCUMULATE = 8, 2
GPT_TRAIN, BERT_TRAIN, EVAL = 96, 64, 32
#: Optimizer steps per epoch: micro-batches / gradient accumulation.
GPT_STEPS = GPT_TRAIN // BATCH // ACCUMULATE
BERT_STEPS = BERT_TRAIN // BATCH
BERT_CLASSES = 4
#: Learning rates that train each model, and 100x those.
GPT_LR, BERT_LR = 5e-3, 3e-3


class Tokens(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor, labels: torch.Tensor):
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def lm_data(n: int, seed: int) -> Tokens:
    """Sequences x[t+1] = (5 x[t] + 3) mod 128 from random starts: learnable next tokens."""
    g = torch.Generator().manual_seed(seed)
    x = [torch.randint(0, VOCAB, (n,), generator=g)]
    for _ in range(SEQ - 1):
        x.append((x[-1] * 5 + 3) % VOCAB)
    ids = torch.stack(x, 1)
    return Tokens(ids, ids)


def cls_data(n: int, seed: int) -> Tokens:
    """Random tokens of one residue mod 4, the class."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, BERT_CLASSES, (n,), generator=g)
    ids = torch.randint(0, VOCAB // BERT_CLASSES, (n, SEQ), generator=g) * BERT_CLASSES
    return Tokens(ids + labels[:, None], labels)


def _token_accuracy(pred) -> dict[str, float]:
    logits, labels = pred.predictions, pred.label_ids
    return {"accuracy": float(np.mean(logits[:, :-1].argmax(-1) == labels[:, 1:]))}


def _class_accuracy(pred) -> dict[str, float]:
    return {"accuracy": float(np.mean(pred.predictions.argmax(-1) == pred.label_ids))}


def _args(out: Path, lr: float, **kw) -> TrainingArguments:
    from transformers import TrainingArguments

    return TrainingArguments(str(out), **{
        "num_train_epochs": EPOCHS, "per_device_train_batch_size": BATCH,
        "per_device_eval_batch_size": EVAL, "learning_rate": lr, "logging_steps": 1,
        "eval_strategy": "epoch", "save_strategy": "no", "report_to": "tensorboard",
        "use_cpu": True, "disable_tqdm": True, "dataloader_num_workers": 0, "seed": 0, **kw})


def gpt2() -> GPT2LMHeadModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB,
                                      n_positions=SEQ, bos_token_id=0, eos_token_id=0))


def train_gpt2(out: Path, lr: float = GPT_LR, **options) -> Trainer:
    """The tiny GPT-2 (2 layers, width 64, vocabulary 128), gradient accumulation 2 and
    clipping at norm 1; its TensorBoard run is ``out/runs/<date_host>``."""
    from transformers import Trainer

    from tb_introspect.transformers import IntrospectCallback

    torch.manual_seed(0)
    model = gpt2()
    trainer = Trainer(model=model, args=_args(out, lr, gradient_accumulation_steps=ACCUMULATE,
                                              max_grad_norm=1.0),
                      train_dataset=lm_data(GPT_TRAIN, 0), eval_dataset=lm_data(EVAL, 1),
                      compute_metrics=_token_accuracy,
                      callbacks=[IntrospectCallback(**{"every": "epoch", **options})])
    trainer.train()
    return trainer


def gpt2_trainer(out: Path, trainer: type[Trainer] | None = None, callbacks=(),
                 **args) -> Trainer:
    """``train_gpt2``'s training (gradient accumulation 2, clipping at norm 1), not yet
    run, by ``trainer`` (a ``Trainer`` subclass) with ``callbacks``; ``args`` replace the
    ``TrainingArguments``' (the trainer writes no TensorBoard run unless asked)."""
    from transformers import Trainer

    torch.manual_seed(0)
    args = _args(out, args.pop("learning_rate", GPT_LR), **{
        "gradient_accumulation_steps": ACCUMULATE, "max_grad_norm": 1.0, "report_to": "none",
        **args})
    return (trainer or Trainer)(model=gpt2(), args=args, train_dataset=lm_data(GPT_TRAIN, 0),
                                eval_dataset=lm_data(EVAL, 1), callbacks=list(callbacks))


def train_bert(out: Path, lr: float = BERT_LR, **options) -> Trainer:
    """The tiny BERT classifier (2 layers, width 64, 4 classes)."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer

    from tb_introspect.transformers import IntrospectCallback

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=SEQ, num_labels=BERT_CLASSES,
        type_vocab_size=1))
    trainer = Trainer(model=model, args=_args(out, lr), train_dataset=cls_data(BERT_TRAIN, 0),
                      eval_dataset=cls_data(EVAL, 1), compute_metrics=_class_accuracy,
                      callbacks=[IntrospectCallback(**{"every": "epoch", **options})])
    trainer.train()
    return trainer


def run_dir(out: Path) -> Path:
    """The one TensorBoard run under ``out/runs``."""
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]
