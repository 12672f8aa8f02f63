"""``cli.py remove-norms``: fine-tune a trained pre-LayerNorm GPT until it has no LayerNorm (Baroni et al. 2025).

"Transformers Don't Need LayerNorm at Inference Time" (arXiv 2507.02559; code submarat/removing-layer-norm,
``train.py``, ``config.py``). During a short fine-tune each LayerNorm is replaced, one at a time, by a
``FakeLayerNorm``: ``(x - mean(x)) / sigma * w + b`` with sigma a frozen scalar, an EMA (momentum 0.9) of
the per-token std, updated while the norm is still real and frozen when it goes fake (the reference with
``EXP_RECOMPUTE_STD_ON_REAL=1``, as its LoRA script sets). The order and gaps are ``make_gpt2_standard``'s,
with the model's depth L:

    step 20 + 2 i            the MLP-input norm (ln_2) of block i
    then every 2 steps       the attention-input norm on the query/key path (ln_1 QK) of block i
    then every 3 steps       the attention-input norm on the value path (ln_1 V) of block i
    then once                the final norm (ln_f)

300 steps in all, AdamW lr 6e-4 with 20 warmup steps and a cosine to 3e-4, weight decay 0.01, gradient
clipping 1.0, betas (0.9, 0.999) (the Hugging Face Trainer's defaults the reference runs with). The query/key
and value paths of one attention-input norm share its sigma (as the reference's one module does): it stays
in sync with the EMA until both paths are fake. The reference's special sigma for BOS and EOT positions is
not reproduced: its defaults leave it off, and character-level text has neither token.

The result is exported as a ``lnfree`` checkpoint (every norm a centring and a fixed gain and bias, ``w /
sigma``), whose validation loss is checked to equal the fine-tuned model's. The command prints the
validation loss before, after, and (``--control``) after the same fine-tune with the norms kept, the
paper's comparison (+0.067 nats for GPT-2 Small against vanilla fine-tuning).

    python cli.py remove-norms CKPT --out lnfree.ckpt [--control] [--seed 0]
"""

from __future__ import annotations

import dataclasses
import json
import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.progress import TrainingProgress, declare_progress_hook
from lit.diagnostics import DiagnosticsConfig
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.language_model import LanguageModel
from lit.procedures.checkpoint_io import TrainedLM, read_trained_lm, write_lm_checkpoint

STD_EPS = 1e-5  # inside the per-token std the EMA averages (the reference's)


@dataclasses.dataclass(frozen=True)
class RemovalSchedule:
    """The reference's ``make_gpt2_standard`` schedule, in optimizer steps, for ``n_layers`` blocks."""

    n_layers: int
    start: int = 20
    gap_mlp: int = 2
    gap_qk: int = 2
    gap_v: int = 3

    def mlp(self, i: int) -> int:
        return self.start + i * self.gap_mlp

    def qk(self, i: int) -> int:
        return self.start + self.n_layers * self.gap_mlp + i * self.gap_qk

    def v(self, i: int) -> int:
        return self.start + self.n_layers * (self.gap_mlp + self.gap_qk) + i * self.gap_v

    def final(self) -> int:
        return self.start + self.n_layers * (self.gap_mlp + self.gap_qk + self.gap_v)


class FakeLayerNorm(nn.Module):
    """LayerNorm whose division by the token's std is replaced, per input path, by a frozen scalar from a step on.

    ``switch_at`` maps each path (``main``, or ``qk`` and ``v`` for the attention input) to the step at which
    it goes fake; a progress hook sets the paths from the step.
    """

    def __init__(self, norm: nn.LayerNorm, init_std: float, switch_at: dict[str, int], momentum: float = 0.9):
        super().__init__()
        dim = norm.normalized_shape[0]
        self.eps, self.momentum, self.switch_at = norm.eps, momentum, dict(switch_at)
        self.weight = nn.Parameter(norm.weight.detach().clone() if norm.weight is not None else torch.ones(dim))
        self.bias = nn.Parameter(norm.bias.detach().clone() if norm.bias is not None else torch.zeros(dim))
        self.register_buffer("real_std", torch.tensor(float(init_std)))    # the EMA
        self.register_buffer("frozen_std", torch.tensor(float(init_std)))  # what a fake path divides by
        self.fake = {path: False for path in self.switch_at}
        declare_progress_hook(self, FakeLayerNorm.on_progress)

    def on_progress(self, progress: TrainingProgress) -> None:
        self.fake = {path: progress.step >= step for path, step in self.switch_at.items()}

    def forward(self, x: torch.Tensor, path: str = "main") -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                token_std = (x.float().var(dim=-1, unbiased=False) + STD_EPS).sqrt().mean()
                self.real_std.mul_(self.momentum).add_((1 - self.momentum) * token_std)
        if self.fake[path]:
            return (x - x.mean(dim=-1, keepdim=True)) / self.frozen_std * self.weight + self.bias
        if self.training:
            # sigma follows the EMA while this norm is still in use; a new tensor, not copy_: the other path may
            # have divided by the old one in this forward pass, and autograd keeps it
            self.frozen_std = self.real_std.clone()
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class SplitPathQKV(nn.Module):
    """The fused q|k|v projection reading the attention-input norm twice: queries and keys through its ``qk``
    path, values through its ``v`` path (the reference's patched attention, ``x_qk`` and ``x_v``)."""

    def __init__(self, norm: FakeLayerNorm, qkv: nn.Linear, d_model: int):
        super().__init__()
        self.norm, self.qkv, self.split = norm, qkv, 2 * d_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b, s = self.qkv.weight, self.qkv.bias, self.split
        qk = F.linear(self.norm(x, "qk"), w[:s], None if b is None else b[:s])
        v = F.linear(self.norm(x, "v"), w[s:], None if b is None else b[s:])
        return torch.cat([qk, v], dim=-1)


def check_removable(source: TrainedLM) -> None:
    arch, what = source.arch, f"remove-norms: {source.path}"
    if arch.norm != "layernorm":
        raise UserInputError(f"{what} uses norm {arch.norm!r}; remove-norms removes the LayerNorms of a pre-LayerNorm "
                             f"model (norm: layernorm)")
    if arch.residual != "add" or arch.projection != "linear":
        raise UserInputError(f"{what} uses residual {arch.residual!r} and projection {arch.projection!r}; "
                             f"remove-norms handles the plain residual (add) and dense projections (linear)")


@torch.no_grad()
def _input_stds(model: nn.Module, batch: torch.Tensor) -> dict[nn.Module, float]:
    """The mean per-token std of every LayerNorm's input on one batch (the EMA's starting point)."""
    stds: dict[nn.Module, float] = {}
    handles = [m.register_forward_pre_hook(
        lambda mod, args: stds.__setitem__(mod, (args[0].float().var(-1, unbiased=False) + STD_EPS).sqrt().mean()
                                           .item()))
        for m in model.modules() if isinstance(m, nn.LayerNorm)]
    model(batch)
    for h in handles:
        h.remove()
    return stds


def install_fake_norms(gpt: nn.Module, schedule: RemovalSchedule, batch: torch.Tensor) -> list[FakeLayerNorm]:
    """Replace every LayerNorm of ``gpt`` by a FakeLayerNorm on ``schedule``, in place."""
    stds = _input_stds(gpt, batch)
    fakes = []
    for i, block in enumerate(gpt.stack.blocks):
        attn_norm = FakeLayerNorm(block.attn_in, stds[block.attn_in], {"qk": schedule.qk(i), "v": schedule.v(i)})
        block.attn.qkv = SplitPathQKV(attn_norm, block.attn.qkv, gpt.stack.cfg.d_model)
        block.attn_in = nn.Identity()
        block.mlp_in = FakeLayerNorm(block.mlp_in, stds[block.mlp_in], {"main": schedule.mlp(i)})
        fakes += [attn_norm, block.mlp_in]
    gpt.stack.final = FakeLayerNorm(gpt.stack.final, stds[gpt.stack.final], {"main": schedule.final()})
    return [*fakes, gpt.stack.final]


def export_lnfree(source: TrainedLM, finetuned: LanguageModel) -> LanguageModel:
    """The fine-tuned model (every norm fake) as a ``lnfree`` LanguageModel: gains ``w / sigma``, no statistics."""
    arch = dataclasses.replace(source.arch, norm="lnfree", norm_options={})
    export = source.build(arch)
    state = {}
    for key, value in finetuned.state_dict().items():
        if ".attn.qkv.norm." in key or key.endswith(("real_std", "frozen_std")):
            continue
        state[key.replace(".attn.qkv.qkv.", ".attn.qkv.")] = value
    gpt = finetuned.model
    sites = [(f"model.stack.blocks.{i}.{name}", norm) for i, block in enumerate(gpt.stack.blocks)
             for name, norm in (("attn_in", block.attn.qkv.norm), ("mlp_in", block.mlp_in))]
    for prefix, norm in [*sites, ("model.stack.final", gpt.stack.final)]:
        state[f"{prefix}.weight"] = (norm.weight / norm.frozen_std).detach()
        state[f"{prefix}.bias"] = norm.bias.detach()
    export.load_state_dict(state)
    return export


@torch.no_grad()
def validation_loss(module: LanguageModel, datamodule: L.LightningDataModule, batches: int | None = None) -> float:
    """Mean cross-entropy per token over the validation split (its first ``batches`` batches if given)."""
    module.eval()
    total, count = 0.0, 0
    for i, (idx, targets) in enumerate(datamodule.val_dataloader()):
        if batches is not None and i >= batches:
            break
        logits = module(idx)
        total += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum").item()
        count += targets.numel()
    return total / count


def finetune(source: TrainedLM, datamodule: L.LightningDataModule, steps: int, seed: int, remove: bool,
             lr: float, min_lr: float, warmup: int) -> LanguageModel:
    L.seed_everything(seed, verbose=False)
    module = source.load(lr=lr, weight_decay=0.01, betas=(0.9, 0.999), warmup_steps=warmup,
                         min_lr_ratio=min_lr / lr, diagnostics=DiagnosticsConfig(interval=0))
    if remove:
        batch = next(iter(datamodule.train_dataloader()))[0]
        install_fake_norms(module.model, RemovalSchedule(source.arch.n_layers), batch)
    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, gradient_clip_val=1.0, limit_val_batches=0,
                        num_sanity_val_steps=0, devices=1)
    trainer.fit(module, datamodule=datamodule)
    return module


@one_line_errors
def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="cli.py remove-norms", description=(
        "Fine-tune a trained pre-LayerNorm GPT while its LayerNorms are removed one by one on the schedule of "
        "Baroni et al. 2025, then write it as a lnfree checkpoint (no normalisation left)."))
    parser.add_argument("checkpoint", help="a LanguageModel checkpoint trained with norm: layernorm")
    parser.add_argument("--out", required=True, help="where to write the LayerNorm-free checkpoint")
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps (reference: 300, GPT-2 Small)")
    parser.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (the reference's 6e-4)")
    parser.add_argument("--min-lr", type=float, default=3e-4, help="where the cosine ends (the reference's 3e-4)")
    parser.add_argument("--warmup", type=int, default=20, help="warmup steps (the reference's 20)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    parser.add_argument("--text-file", default=None, help="the corpus (default: the embedded tinyshakespeare)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data order")
    parser.add_argument("--val-batches", type=int, default=None, help="validation batches (default: the whole split)")
    parser.add_argument("--control", action="store_true",
                        help="also fine-tune with the norms kept (the paper's vanilla fine-tune) and report its loss")
    parser.add_argument("--json", default=None, help="also write the losses to this JSON file")
    args = parser.parse_args(argv)

    from lit.data import TextDataModule

    source = read_trained_lm(args.checkpoint, "remove-norms")
    check_removable(source)
    schedule = RemovalSchedule(source.arch.n_layers)
    if args.steps <= schedule.final():
        raise UserInputError(f"remove-norms: --steps {args.steps} ends before the last norm goes fake at step "
                             f"{schedule.final()} ({source.arch.n_layers} blocks); give more steps")
    datamodule = TextDataModule(text_file=args.text_file, block_size=source.hparams["block_size"],
                                batch_size=args.batch_size, seed=args.seed)
    datamodule.setup("fit")
    report = {"checkpoint": str(source.path), "seed": args.seed, "steps": args.steps,
              "before": validation_loss(source.load(), datamodule, args.val_batches)}
    lnfree = finetune(source, datamodule, args.steps, args.seed, True, args.lr, args.min_lr, args.warmup)
    report["lnfree"] = validation_loss(lnfree, datamodule, args.val_batches)
    exported = export_lnfree(source, lnfree)
    report["exported"] = validation_loss(exported, datamodule, args.val_batches)
    if not math.isclose(report["exported"], report["lnfree"], rel_tol=1e-4, abs_tol=1e-4):
        raise UserInputError(f"remove-norms: the exported model's loss {report['exported']:.5f} differs from the "
                             f"fine-tuned one's {report['lnfree']:.5f}; nothing written")
    if args.control:
        control = finetune(source, datamodule, args.steps, args.seed, False, args.lr, args.min_lr, args.warmup)
        report["control"] = validation_loss(control, datamodule, args.val_batches)
    out = write_lm_checkpoint(source, exported, exported.hparams.arch, args.out)
    line = f"val loss before {report['before']:.4f}, LayerNorm-free after {args.steps} steps {report['lnfree']:.4f}"
    if args.control:
        line += f", norms kept {report['control']:.4f} (LN-free - kept: {report['lnfree'] - report['control']:+.4f})"
    print(f"wrote {out} (norm lnfree): {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0

