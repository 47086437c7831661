"""Lightning's ``ModelParallelStrategy`` (FSDP2 through ``configure_model``) on 2 CPU
processes with ``IntrospectCallback``, for tests/trainers/test_sharded_trainers.py (run as a script,
once per rank, ``LOCAL_RANK`` and the rendezvous set as ``torchrun`` sets them).

    python lightning_sharded_worker.py LOG_DIR
"""

from __future__ import annotations

import sys

import torch
from torch import nn

STEPS = 4


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 64), nn.ReLU(),
                         nn.Linear(64, 5))


def _sharded():
    """The LightningModule (Lightning is imported here: the test imports this module for
    ``mlp`` and ``STEPS`` without paying for Lightning's import)."""
    import lightning as L

    class Sharded(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = mlp()

        def configure_model(self) -> None:
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Sharded()


def main(log_dir: str) -> None:
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from tb_introspect.lightning import IntrospectCallback

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 12, generator=g),
                                          torch.randint(0, 5, (64,), generator=g))
    trainer = L.Trainer(
        accelerator="cpu", devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[IntrospectCallback(log_dir, every=1)])
    trainer.fit(_sharded(), torch.utils.data.DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main(sys.argv[1])
