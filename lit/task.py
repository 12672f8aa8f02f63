"""What every task's LightningModule shares: the optimizer, the constraints and the parallel layout.

Subclasses (LanguageModel, ImageClassifier) build ``self.model`` and save ``lr``, ``weight_decay``,
``betas``, ``warmup_steps`` and ``min_lr_ratio`` as hyperparameters; they own loss and metrics only.
"""

from __future__ import annotations

import lightning as L

from lit.callbacks import RenormalizeUnitNormWeights, has_unit_norm_weights
from lit.optim import adamw_warmup_cosine
from lit.parallel import shard


class ArchitectureTask(L.LightningModule):
    def configure_model(self) -> None:
        # Strategies with a device mesh (ModelParallelStrategy) shard here; every other strategy has none.
        if self.device_mesh is not None:
            shard(self.model, self.device_mesh)

    def configure_callbacks(self) -> list[L.Callback]:
        # Whatever the architecture, weights that declared a unit-norm constraint are kept on the sphere;
        # attached here so that selecting such a plugin on the command line cannot forget the callback.
        return [RenormalizeUnitNormWeights()] if has_unit_norm_weights(self.model) else []

    def configure_optimizers(self):
        hp = self.hparams
        return adamw_warmup_cosine(self, hp.lr, hp.weight_decay, hp.betas, hp.warmup_steps, hp.min_lr_ratio)
