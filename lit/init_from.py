"""Start a run from another run's weights: fine-tuning, or growing a TokenFormer into a larger one.

The file is a Lightning checkpoint of this project, or a timm/DeiT ViT file (a plain state dict, DeiT's
``{"model": ...}`` release files, timm's training checkpoints, or ``.safetensors``): its tensors are renamed to
ours (``lit/models/timm_vit.py``), the positions resampled when the image size differs (timm's
``resample_abs_pos_embed``), and the head left at its fresh init when the class count differs.

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


def allow_checkpoint_types() -> None:
    """Registers ``CHECKPOINT_TYPES`` for every weights-only load (idempotent). Called at import and again by every
    task as it is built: a ``torch.serialization.safe_globals`` block that was open when this module was first
    imported restores the list it found when it closes, and takes this registration with it."""
    missing = [t for t in CHECKPOINT_TYPES if t not in torch.serialization.get_safe_globals()]
    if missing:
        torch.serialization.add_safe_globals(missing)


allow_checkpoint_types()


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


def timm_vit_state(checkpoint: Any) -> dict[str, torch.Tensor] | None:
    """The timm ViT state dict inside a loaded file (plain, DeiT's ``model``, timm's ``state_dict``), or None."""
    if not isinstance(checkpoint, dict):
        return None
    for candidate in (checkpoint, checkpoint.get("model"), checkpoint.get("state_dict")):
        if isinstance(candidate, dict) and "patch_embed.proj.weight" in candidate:
            return candidate
    return None


def load_timm_vit(module: nn.Module, timm_state: dict[str, torch.Tensor], path: Path) -> None:
    """Load a timm ViT's weights into ``module.model`` (our ViT with the baseline plugins)."""
    from lit.models.timm_vit import state_dict_from_timm

    try:
        ours = state_dict_from_timm(timm_state)
    except KeyError as exc:
        raise UserInputError(f"init_from {path}: {exc.args[0]}") from exc
    vit = module.model
    notes = []
    if "pos_embed" in ours and vit.pos_embed is not None and ours["pos_embed"].shape != vit.pos_embed.shape:
        from timm.layers import resample_abs_pos_embed

        prefix = 1 if vit.cls_token is not None else 0
        side = int(round((vit.pos_embed.shape[1] - prefix) ** 0.5))
        before = ours["pos_embed"].shape[1]
        ours["pos_embed"] = resample_abs_pos_embed(ours["pos_embed"], (side, side), num_prefix_tokens=prefix)
        notes.append(f"positions resampled from {before} to {vit.pos_embed.shape[1]} tokens")
    if "head.weight" in ours and ours["head.weight"].shape != vit.head.weight.shape:
        # Another class count: the new head starts from this model's own init, as timm's reset_classifier does.
        notes.append(f"head re-initialised for {vit.head.weight.shape[0]} classes "
                     f"(the file's has {ours['head.weight'].shape[0]})")
        ours = {k: v for k, v in ours.items() if not k.startswith("head.")}
    try:
        missing, unexpected = vit.load_state_dict(ours, strict=False)
    except RuntimeError as exc:
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
        raise UserInputError(f"init_from {path}: the timm ViT does not have this model's shape: {first} "
                             f"(set --model.variant, --model.patch_size and --data.image_size to the file's)") from exc
    missing = [k for k in missing if not k.startswith("head.")]
    if missing or unexpected:
        raise UserInputError(f"init_from {path}: the timm ViT and this model differ in {(missing + unexpected)[:3]}: "
                             f"timm's ViT is the baseline plugins (layernorm, add, linear, gelu, biases, cls pooling, "
                             f"learned positions)")
    rank_zero_info(f"Initialised weights from timm ViT {path}" + (f"; {'; '.join(notes)}" if notes else ""))


def load_initial_weights(module: nn.Module, path: str | Path, growth: Growth) -> None:
    """Load the ``state_dict`` of a Lightning checkpoint into ``module`` (a LightningModule), growing where needed;
    or a timm ViT's weights into its ViT."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"init_from checkpoint not found: {path} (give the path of a .ckpt file, or of a "
                             f"timm/DeiT ViT .pth or .safetensors file)")
    if getattr(module, "built_on_meta", False):
        return  # rank 0 loads them; they arrive with its other weights after sharding (lit/sharded_build.py)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            checkpoint = load_file(str(path))
        except Exception as exc:
            raise UserInputError(f"cannot read init_from file {path}: {str(exc).splitlines()[0]}") from exc
    else:
        checkpoint = load_weights_only(path, "init_from checkpoint")
    timm_state = timm_vit_state(checkpoint)
    if timm_state is not None:
        if not hasattr(getattr(module, "model", None), "patch"):
            raise UserInputError(f"init_from {path} is a timm ViT: it starts an image classifier (ViT), not this model")
        load_timm_vit(module, timm_state, path)
        return
    state_dict = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if state_dict is None:
        raise UserInputError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    try:
        grown = load_grown(module, state_dict, new_keys=growth.new_keys, preserve_function=growth.preserve_function)
    except GrowthError as exc:
        raise UserInputError(f"init_from {path}: {exc}") from exc
    summary = f"; grew {len(grown)} modules ({grown[0]}, ...)" if grown else ""
    rank_zero_info(f"Initialised weights from {path}{summary}")
