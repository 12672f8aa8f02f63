"""LanguageModel: next-token training of a GPT assembled from plugins."""

from __future__ import annotations

import time
from functools import partial

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.text import Perplexity

from lit.callbacks import RenormalizeUnitNormWeights, has_unit_norm_weights
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.optim import adamw, warmup_cosine
from lit.parallel import shard


class LanguageModel(L.LightningModule):
    """Causal language model. Never looks inside the architecture: ``arch`` says it all.

    Args:
        vocab_size: linked from the DataModule.
        block_size: context length; linked from the DataModule.
        arch: the transformer stack and its plugins.
        tie_embeddings: share the token embedding and the LM head.
        lr: peak learning rate.
        weight_decay: AdamW decay of matrices and embeddings (vectors never decay).
        betas: AdamW betas.
        warmup_steps: linear warmup length.
        min_lr_ratio: the cosine ends at ``lr * min_lr_ratio``.
        max_new_tokens: tokens sampled per prompt by ``predict``.
        temperature: sampling temperature (0 = greedy).
        top_k: sample among the k most likely tokens only.
    """

    def __init__(self, vocab_size: int = 65, block_size: int = 256, arch: TransformerConfig = TransformerConfig(),
                 tie_embeddings: bool = False, lr: float = 1e-3, weight_decay: float = 0.1,
                 betas: tuple[float, float] = (0.9, 0.95), warmup_steps: int = 100, min_lr_ratio: float = 0.1,
                 max_new_tokens: int = 200, temperature: float = 0.8, top_k: int | None = None):
        super().__init__()
        # The resolved config is logged by the CLI; the logger need not log hparams a second time.
        self.save_hyperparameters(logger=False)
        self.model = GPT(vocab_size, block_size, arch, tie_embeddings)
        self.val_ppl = Perplexity()
        self._last_step_time: float | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def configure_model(self) -> None:
        # Strategies with a device mesh (ModelParallelStrategy) shard here; every other strategy has none.
        if self.device_mesh is not None:
            shard(self.model, self.device_mesh)

    def configure_callbacks(self) -> list[L.Callback]:
        # Whatever the architecture, weights that declared a unit-norm constraint are kept on the sphere;
        # attached here so that selecting such a plugin on the command line cannot forget the callback.
        return [RenormalizeUnitNormWeights()] if has_unit_norm_weights(self.model) else []

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        idx, targets = batch
        loss = self._loss(self(idx), targets)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        now = time.perf_counter()
        if self._last_step_time is not None:  # wall time of a whole step: data, forward, backward, update
            tokens = idx.numel() * self.trainer.world_size
            self.log("train/tokens_per_s", tokens / (now - self._last_step_time), prog_bar=True)
        self._last_step_time = now
        return loss

    def on_train_epoch_start(self) -> None:
        self._last_step_time = None  # validation time between epochs is not training throughput

    def validation_step(self, batch, batch_idx: int) -> None:
        idx, targets = batch
        logits = self(idx)
        self.log("val/loss", self._loss(logits, targets), prog_bar=True, sync_dist=True)
        self.val_ppl(logits.float(), targets)
        self.log("val/ppl", self.val_ppl)

    def test_step(self, batch, batch_idx: int) -> None:
        idx, targets = batch
        self.log("test/loss", self._loss(self(idx), targets), sync_dist=True)

    def predict_step(self, batch: torch.Tensor, batch_idx: int) -> list[str]:
        hp = self.hparams
        out = self.model.generate(batch, hp.max_new_tokens, hp.temperature, hp.top_k)
        texts = [self.trainer.datamodule.decode(row.tolist()) for row in out]
        for text in texts:
            print(text, flush=True)
        return texts

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = adamw(self, hp.lr, hp.weight_decay, tuple(hp.betas))
        total = self.trainer.estimated_stepping_batches
        schedule = partial(warmup_cosine, warmup_steps=hp.warmup_steps, total_steps=int(total),
                           min_lr_ratio=hp.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
