"""Reading a trained LanguageModel checkpoint into a model, and writing one that ``validate`` and ``init_from`` read.

Shared by the procedures (``convert-norm``, ``remove-norms``): they load a Lightning checkpoint's
hyperparameters and weights, change the architecture, and write a checkpoint of the new architecture with
the same hyperparameters otherwise. A written checkpoint holds the weights and hyperparameters only (no
optimizer or loop state): it starts runs (``fit --model.init_from``) and is evaluated (``validate
--ckpt_path``), it does not resume one.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lit.data import tokenizer_record
from lit.errors import UserInputError
from lit.init_from import load_weights_only
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig


@dataclasses.dataclass
class TrainedLM:
    """A checkpoint's LanguageModel hyperparameters (``arch`` as a TransformerConfig) and its raw file contents."""

    path: Path
    hparams: dict[str, Any]
    arch: TransformerConfig
    checkpoint: dict[str, Any]

    def build(self, arch: TransformerConfig | None = None, **overrides: Any) -> LanguageModel:
        """A LanguageModel of these hyperparameters (``arch`` and ``overrides`` replacing theirs), weights untouched."""
        accepted = inspect.signature(LanguageModel.__init__).parameters
        kwargs = {k: v for k, v in self.hparams.items() if k in accepted and k not in ("arch", "init_from")}
        kwargs.update(overrides)
        return LanguageModel(arch=copy.deepcopy(arch or self.arch), **kwargs)

    def load(self, arch: TransformerConfig | None = None, **overrides: Any) -> LanguageModel:
        """``build`` with this checkpoint's weights loaded (the architecture must be the checkpoint's)."""
        module = self.build(arch, **overrides)
        module.load_state_dict(self.checkpoint["state_dict"])
        return module


def read_checkpoint(path: str | Path, command: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(path, checkpoint, hyperparameters) of a Lightning checkpoint file, or one line saying what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{command}: checkpoint not found: {path} (give a .ckpt file)")
    checkpoint = load_weights_only(path)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserInputError(f"{command}: {path} is not a Lightning checkpoint (it has no state_dict)")
    return path, checkpoint, dict(checkpoint.get("hyper_parameters") or {})


def read_trained_lm(path: str | Path, command: str) -> TrainedLM:
    path, checkpoint, hparams = read_checkpoint(path, command)
    class_path = hparams.get("_class_path", "")
    if not class_path.endswith("LanguageModel") or "arch" not in hparams:
        raise UserInputError(f"{command}: {path} is not a LanguageModel checkpoint ({class_path or 'no model class'}); "
                             f"{command} works on GPT language models")
    arch = hparams["arch"]
    arch = arch if isinstance(arch, TransformerConfig) else TransformerConfig(**dict(arch))
    return TrainedLM(path, hparams, arch, checkpoint)


def write_lm_checkpoint(source: TrainedLM, module: LanguageModel, arch: TransformerConfig, out: str | Path) -> Path:
    """Write ``module``'s weights as a checkpoint of ``arch`` with ``source``'s other hyperparameters."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    hparams = copy.deepcopy(source.hparams)
    hparams["arch"] = dataclasses.asdict(arch)
    hparams.pop("init_from", None)  # the weights are in this file; they do not come from elsewhere any more
    checkpoint = {
        "state_dict": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "hyper_parameters": hparams,
        "hparams_name": source.checkpoint.get("hparams_name", "kwargs"),
        "pytorch-lightning_version": L.__version__,
        "epoch": source.checkpoint.get("epoch", 0),
        "global_step": source.checkpoint.get("global_step", 0),
    }
    if tokenizer_record.in_checkpoint(source.checkpoint) is not None:  # the same token ids: the same tokenizer
        checkpoint[tokenizer_record.CHECKPOINT_KEY] = source.checkpoint[tokenizer_record.CHECKPOINT_KEY]
    torch.save(checkpoint, out)
    return out


def arch_flags(arch: TransformerConfig) -> str:
    """The command-line flags that give a run this checkpoint's norm strategy (for ``fit --model.init_from``)."""
    options = ", ".join(f"{k}: {v}" for k, v in arch.norm_options.items())
    return f"--model.arch.norm={arch.norm} --model.arch.norm_options='{{{options}}}'"


def load_trained_task(path: str | Path, command: str) -> tuple[L.LightningModule, dict[str, Any]]:
    """Any task module's checkpoint (LanguageModel, ImageClassifier, ...: its ``_class_path``) rebuilt with its
    hyperparameters and its weights loaded; returns (module, hyperparameters)."""
    import importlib

    path, checkpoint, hparams = read_checkpoint(path, command)
    class_path = hparams.get("_class_path", "")
    module_name, _, class_name = class_path.rpartition(".")
    try:
        task = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except (ImportError, AttributeError):
        task = None
    if task is None or "arch" not in hparams:
        raise UserInputError(f"{command}: {path} holds no task model this project can rebuild "
                             f"({class_path or 'no model class'}); give a checkpoint written by `cli.py fit`")
    accepted = inspect.signature(task.__init__).parameters
    kwargs = {k: v for k, v in hparams.items() if k in accepted and k not in ("arch", "init_from")}
    arch = hparams["arch"]
    kwargs["arch"] = copy.deepcopy(arch) if isinstance(arch, TransformerConfig) else TransformerConfig(**dict(arch))
    module = task(**kwargs)
    module.load_state_dict(checkpoint["state_dict"])
    return module, hparams


def recipe_datamodule(data: dict, command: str, **overrides: Any) -> L.LightningDataModule:
    """The DataModule a recipe's ``data`` section names (``class_path`` and ``init_args``, ``overrides`` on top), with
    one line when its class cannot be imported."""
    import importlib

    module_name, _, class_name = data["class_path"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UserInputError(f"{command}: the recipe's data class {data['class_path']!r} cannot be imported "
                             f"({exc})") from exc
    return cls(**{**dict(data.get("init_args") or {}), **overrides})
