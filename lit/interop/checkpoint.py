"""A LanguageModel written as a checkpoint of weights and hyperparameters: what ``read_trained_lm``,
``validate --ckpt_path`` and ``fit --model.init_from`` read (no optimizer or loop state)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch


def write_checkpoint(module, out: str | Path) -> Path:
    """``module`` as a Lightning checkpoint of weights and hyperparameters (what ``read_trained_lm`` reads)."""
    import lightning as L

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    hparams = dict(module.hparams)
    hparams["arch"] = dataclasses.asdict(hparams["arch"])
    hparams["_class_path"] = "lit.language_model.LanguageModel"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": hparams, "hparams_name": "kwargs",
                "pytorch-lightning_version": L.__version__, "epoch": 0, "global_step": 0}, out)
    return out
