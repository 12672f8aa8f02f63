"""A callback for the 2-process tests of lit/sharded_build.py: each rank writes whether it built its model on the
meta device, and its whole weights as training starts (after rank 0's arrived), to files in the run's folder."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch


class RecordBuild(L.Callback):
    def on_train_start(self, trainer, pl_module):
        whole = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
                 for name, p in pl_module.model.named_parameters()}
        buffers = {name: b.detach().cpu().clone() for name, b in pl_module.model.named_buffers()}
        Path(f"built_on_meta.rank{trainer.global_rank}.json").write_text(json.dumps(pl_module.built_on_meta))
        torch.save({"parameters": whole, "buffers": buffers, "rng": torch.get_rng_state()},
                   f"start.rank{trainer.global_rank}.pt")
