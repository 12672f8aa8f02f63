"""Start a run from another run's weights: fine-tuning, or growing a TokenFormer into a larger one.

Only the weights are taken (``weights_only`` loading, safe for files from elsewhere): optimizer,
schedule and step start fresh, as the TokenFormer reference does after growth. Resuming an
interrupted run is a different thing: ``fit --ckpt_path``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from arch_plugins.growth import GrowthError, load_grown
from lit.errors import UserInputError
from lit.models.transformer import TransformerConfig


@dataclass
class Growth:
    """How parameter tokens are added when the checkpoint has fewer than the model.

    Args:
        new_keys: ``zero`` (the paper: new tokens start silent) or ``init`` (the reference code: fresh init).
        preserve_function: keep the score scale at the old sqrt(n), so the grown model computes exactly
            the function it was loaded from (needs ``new_keys: zero``).
    """

    new_keys: Literal["zero", "init"] = "zero"
    preserve_function: bool = True


# Our own config types that checkpoints hold in their hyperparameters; nothing else is unpickled.
# Registered once for every weights-only load, so that Lightning's resume (`fit --ckpt_path`) reads them too.
CHECKPOINT_TYPES = [TransformerConfig, Growth]
torch.serialization.add_safe_globals(CHECKPOINT_TYPES)


def load_weights_only(path: Path, what: str = "checkpoint") -> Any:
    """``torch.load`` restricted to weights and ``CHECKPOINT_TYPES``, with the reason of a failure in one line."""
    try:
        with torch.serialization.safe_globals(CHECKPOINT_TYPES):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # truncated or not a torch file, or pickled objects beyond plain weights
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        reason = next((line for line in lines if "Unsupported global" in line), lines[0] if lines else repr(exc))
        raise UserInputError(f"cannot read {what} {path}: {reason} (only plain weights are loaded from files; "
                             f"is it a complete Lightning checkpoint?)") from exc


def load_initial_weights(module: nn.Module, path: str | Path, growth: Growth) -> None:
    """Load the ``state_dict`` of a Lightning checkpoint into ``module`` (a LightningModule), growing where needed."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"init_from checkpoint not found: {path} (give the path of a .ckpt file)")
    checkpoint = load_weights_only(path, "init_from checkpoint")
    state_dict = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if state_dict is None:
        raise UserInputError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    try:
        grown = load_grown(module, state_dict, new_keys=growth.new_keys, preserve_function=growth.preserve_function)
    except GrowthError as exc:
        raise UserInputError(f"init_from {path}: {exc}") from exc
    summary = f"; grew {len(grown)} modules ({grown[0]}, ...)" if grown else ""
    rank_zero_info(f"Initialised weights from {path}{summary}")
