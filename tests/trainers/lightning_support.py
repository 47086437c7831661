"""The Lightning trainings the trainer tests read: a small CNN on scikit-learn's digits
(8x8, 10 classes) with ``IntrospectCallback`` beside a ``TensorBoardLogger``.

``lightning`` is imported where it is used: every pytest worker imports this module when it
collects the tests, and only the one that trains needs it (seconds of import each).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from sklearn.datasets import load_digits
from torch import nn

if TYPE_CHECKING:
    import lightning as L

EPOCHS = 3
BATCH, ACCUMULATE = 32, 2
TRAIN, VAL = 512, 256
#: Optimizer steps per epoch: micro-batches / accumulate_grad_batches.
STEPS = TRAIN // BATCH // ACCUMULATE
#: A learning rate that trains the CNN; the pathological twin has 100x that.
LR = 3e-2


@functools.cache
def _digits_cnn_class() -> type:
    import lightning as L

    class DigitsCNN(L.LightningModule):
        def __init__(self, lr: float = LR):
            super().__init__()
            self.lr = lr
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
            # Normalised before each ReLU: the pooled inputs are all positive, and without it
            # half the dense units start dead (each one's sign set by its weights' sum).
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.BatchNorm1d(64),
                                      nn.ReLU(), nn.Linear(64, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
            self.log("val_accuracy", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.lr)

    return DigitsCNN


def digits_cnn(lr: float = LR) -> L.LightningModule:
    """The CNN: two conv-BN-ReLU blocks, max-pooling, a dense BN-ReLU layer, 10 logits."""
    return _digits_cnn_class()(lr)


def loaders(world: int = 1) -> tuple:
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None]
    y = torch.tensor(d.target)
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(len(x), generator=g)
    tr, va = idx[:TRAIN], idx[TRAIN:TRAIN + VAL]
    ds = torch.utils.data.TensorDataset
    return (torch.utils.data.DataLoader(ds(x[tr], y[tr]), batch_size=BATCH // world,
                                        shuffle=True, generator=g),
            torch.utils.data.DataLoader(ds(x[va], y[va]), batch_size=VAL // world))


def fit(root: Path, lr: float = LR, strategy="auto", devices: int = 1,
        **options) -> L.Trainer:
    """Three epochs with accumulate_grad_batches=2, bf16-mixed and gradient clipping; the
    logger writes ``root/lightning_logs/version_0``."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    from tb_introspect.lightning import IntrospectCallback

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_epochs=EPOCHS, accelerator="cpu", devices=devices, strategy=strategy,
        precision="bf16-mixed", accumulate_grad_batches=ACCUMULATE, gradient_clip_val=1.0,
        logger=TensorBoardLogger(str(root)),
        callbacks=[IntrospectCallback(**{"every": "epoch", **options})],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(root))
    train, val = loaders(devices)
    trainer.fit(digits_cnn(lr), train, val)
    return trainer


def main() -> None:
    """``python -m tests.trainers.lightning_support ROOT``: the healthy CNN under DDP on
    two CPU processes (gloo), each with half of every batch."""
    sys.modules["tensorflow"] = None  # TensorBoard's writer without TensorFlow's import
    from lightning.pytorch.strategies import DDPStrategy

    torch.set_num_threads(1)
    # Statistics on every step: the counts of a point are then every sample's, both ranks'.
    fit(Path(sys.argv[1]), strategy=DDPStrategy(process_group_backend="gloo",
                                                start_method="popen"), devices=2,
        stats_every=1, overhead=None)


if __name__ == "__main__":
    main()
