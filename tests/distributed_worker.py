"""Trains a tiny nGPT for a few optimizer steps under one strategy and saves the full weights (rank 0).

Run as a script by tests/test_distributed.py: Lightning's ddp and ModelParallelStrategy launchers
re-execute it once per extra process, which is awkward inside pytest itself. Every rank
sees the same batches (no distributed sampler), so data-parallel training on N ranks computes the
single-process gradient and must end with the single-process weights.

    python tests/distributed_worker.py --strategy fsdp2 --out weights.pt [--optimizer muon]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, as pytest's subprocess does

from arch_plugins.constraints import declare_unit_norm, renormalize_  # noqa: E402
from lit.callbacks import RenormalizeUnitNormWeights  # noqa: E402
from lit.language_model import LanguageModel  # noqa: E402
from lit.models import TransformerConfig  # noqa: E402

VOCAB, T, STEPS, ACCUMULATE = 17, 16, 3, 2  # odd vocabulary: the embedding and head shard unevenly
SMALL_SHAPES = [((5, 1), 0), ((4, 3), 0), ((4, 3), 1)]  # (in, out) of a Linear, declared dim
CONV = (2, 3, 2)  # in channels, out channels (sharded dim 0, the declared one: a ViT patch embedding), kernel


# Muon for the hidden matrices (fused q|k|v and gate|up split per part), AdamW for the rest.
MUON = {"lr": 0.05, "weight_decay": 0.1, "adjust_lr": "original"}


def build_model(optimizer: str = "adamw") -> LanguageModel:
    torch.manual_seed(0)  # every rank builds the same initial weights (FSDP2 shards what each rank built)
    arch = TransformerConfig(d_model=32, n_layers=2, n_heads=2, norm="hypersphere", residual="ngpt", init_std=0.2)
    return LanguageModel(vocab_size=VOCAB, block_size=T, arch=arch, lr=2e-2, weight_decay=0.0, warmup_steps=0,
                         optimizer=optimizer, optimizer_options=MUON if optimizer == "muon" else None)


def batches() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (STEPS * ACCUMULATE * 4, T + 1), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4, shuffle=False)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (collective for DTensors: every rank must call it)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def small_weights_renormalized(mesh) -> list[torch.Tensor]:
    """Weights with fewer rows than ranks (or uneven shards) renormalised under FSDP2, gathered."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(2)
    layers = [nn.Linear(i, o, bias=False) for (i, o), _ in SMALL_SHAPES] + [nn.Conv2d(*CONV, bias=False)]
    for layer, dim in zip(layers, [dim for _, dim in SMALL_SHAPES] + [0], strict=True):
        declare_unit_norm(layer, "weight", dim)
        fully_shard(layer, mesh=mesh)
    renormalize_(nn.ModuleList(layers))
    return [full(layer.weight) for layer in layers]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=["single", "ddp", "fsdp2"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw")
    args = p.parse_args(argv)
    if args.strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy, devices = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), 2
    else:
        strategy, devices = ("ddp", 2) if args.strategy == "ddp" else ("auto", 1)
    model = build_model(args.optimizer)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=STEPS,
                        accumulate_grad_batches=ACCUMULATE, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(model, batches())
    renorm = next(c for c in trainer.callbacks if isinstance(c, RenormalizeUnitNormWeights))
    state = {name: full(param) for name, param in model.model.named_parameters()}
    small = small_weights_renormalized(model.device_mesh["data_parallel"]) if args.strategy == "fsdp2" else []
    placements = {name: str(getattr(param, "placements", None)) for name, param in model.model.named_parameters()}
    if trainer.global_rank == 0:
        torch.save({"state": state, "small": small, "placements": placements, "world_size": trainer.world_size,
                    "global_step": trainer.global_step, "steps_renormalized": renorm.steps_renormalized}, args.out)


if __name__ == "__main__":
    main()
