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

The data are a recipe's (``--config``: its data section), token shards (``--shards``, any tokenizer) or
char-level text (``--text-file``, default the embedded tinyshakespeare); a checkpoint whose vocabulary is not
the data's is refused. The reference's 2^19 tokens per step are ``--batch-size`` x ``--accumulate`` x
processes x context; ``--precision bf16-mixed`` runs the forward under autocast and ``--devices N`` on N
processes (Lightning's DDP, or started by torchrun). Steps, and the removal schedule, count optimizer steps.

    python cli.py remove-norms CKPT --out lnfree.ckpt [--shards DIR | --config RECIPE] [--control] [--seed 0]
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_roles
from arch_plugins.interfaces import Role
from arch_plugins.progress import TrainingProgress, declare_progress_hook
from lit.diagnostics import DiagnosticsConfig
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.language_model import LanguageModel
from lit.procedures.checkpoint_io import TrainedLM, read_trained_lm, recipe_datamodule, write_lm_checkpoint

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
        # the LayerNorm's roles (no weight decay on either, as the Hugging Face Trainer the reference runs with)
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})
        declare_progress_hook(self, FakeLayerNorm.on_progress)

    def on_progress(self, progress: TrainingProgress) -> None:
        self.fake = {path: progress.step >= step for path, step in self.switch_at.items()}

    def forward(self, x: torch.Tensor, path: str = "main") -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                token_std = (x.float().var(dim=-1, unbiased=False) + STD_EPS).sqrt().mean()
                self.real_std.mul_(self.momentum).add_((1 - self.momentum) * token_std)
        if self.fake[path]:
            # divide by a copy: the other path may still update sigma in place later in this forward pass, and
            # autograd keeps what this one divided by
            return (x - x.mean(dim=-1, keepdim=True)) / self.frozen_std.clone() * self.weight + self.bias
        if self.training:
            # sigma follows the EMA while this norm is still in use. In place, not a new tensor: DDP broadcasts rank
            # 0's buffers before each forward pass, but only the tensors it found when it wrapped the model, so a
            # replaced sigma would drift apart on each rank and rank 0's would be the only one exported
            self.frozen_std.copy_(self.real_std)
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


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def validation_loss(module: LanguageModel, datamodule: L.LightningDataModule, batches: int | None = None,
                    device: torch.device | str = "cpu") -> float:
    """Mean cross-entropy per token over the validation split (its first ``batches`` batches if given), in fp32.

    Under several processes each scores every world-th batch and the sums are all-reduced, so every rank gets the
    loss of the whole split, each batch counted once. fp32 whatever the training precision: the export check
    compares two models that bf16 would round differently."""
    import torch.distributed as dist

    rank, world = _rank_and_world()
    module.to(device).eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # nats, tokens
    for i, (idx, targets) in enumerate(datamodule.val_dataloader()):
        if batches is not None and i >= batches:
            break
        if i % world != rank:
            continue
        idx, targets = idx.to(device), targets.to(device)
        logits = module(idx)
        total[0] += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum").double()
        total[1] += targets.numel()
    if world > 1:
        dist.all_reduce(total)
    module.cpu()
    return (total[0] / total[1]).item()


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the fine-tune runs: tokens per optimizer step are batch_size x accumulate x processes x context."""

    steps: int
    seed: int
    lr: float = 6e-4
    min_lr: float = 3e-4
    warmup: int = 20
    accumulate: int = 1
    precision: str = "32-true"
    accelerator: str = "auto"
    devices: int = 1
    strategy: str = "auto"

    def trainer(self, **extra) -> L.Trainer:
        strategy = self.strategy
        if strategy == "auto" and self.devices > 1:
            strategy = "ddp"  # the reference's data parallelism: the model replicated, the batch split
        return L.Trainer(max_steps=self.steps, accumulate_grad_batches=self.accumulate, precision=self.precision,
                         accelerator=self.accelerator, devices=self.devices, strategy=strategy, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         gradient_clip_val=1.0, limit_val_batches=0, num_sanity_val_steps=0, **extra)


def finetune(source: TrainedLM, datamodule: L.LightningDataModule, options: RunOptions, remove: bool,
             **trainer_extra) -> tuple[LanguageModel, L.Trainer]:
    """Fine-tune ``source`` with the reference's optimizer, its norms removed on the schedule if ``remove``."""
    L.seed_everything(options.seed, verbose=False)
    module = source.load(lr=options.lr, weight_decay=0.01, betas=(0.9, 0.999), warmup_steps=options.warmup,
                         min_lr_ratio=options.min_lr / options.lr, diagnostics=DiagnosticsConfig(interval=0))
    if remove:
        batch = next(iter(datamodule.train_dataloader()))[0]
        install_fake_norms(module.model, RemovalSchedule(source.arch.n_layers), batch)
    trainer = options.trainer(**trainer_extra)
    trainer.fit(module, datamodule=datamodule)
    return module, trainer


def read_recipe_data(path: str, **overrides) -> L.LightningDataModule:
    """The DataModule of a recipe's data section, with ``overrides`` replacing its arguments."""
    import yaml

    recipe_path = Path(path)
    if not recipe_path.is_file():
        raise UserInputError(f"remove-norms: recipe not found: {recipe_path} (give a YAML with a data section to "
                             f"--config)")
    recipe = yaml.safe_load(recipe_path.read_text()) or {}
    data = recipe.get("data") if isinstance(recipe, dict) else None
    if not isinstance(data, dict) or "class_path" not in data:
        raise UserInputError(f"remove-norms: {recipe_path} has no data section with a class_path; give the recipe "
                             f"of a language model, or --shards DIR")
    return recipe_datamodule(data, "remove-norms", **overrides)


def datamodule_for(args, block_size: int) -> L.LightningDataModule:
    """The fine-tuning data: a recipe's, token shards, or char-level text, at ``block_size`` tokens per sequence."""
    from lit.data import TextDataModule

    given = [name for name, value in (("--config", args.config), ("--shards", args.shards),
                                      ("--text-file", args.text_file)) if value is not None]
    if len(given) > 1:
        raise UserInputError(f"remove-norms: give one data source, not {' and '.join(given)}")
    common = dict(block_size=block_size, batch_size=args.batch_size, seed=args.seed)
    if args.config is not None:
        return read_recipe_data(args.config, **common)
    if args.shards is not None:
        return TextDataModule(shards_dir=args.shards, tokenizer=args.tokenizer, **common)
    return TextDataModule(text_file=args.text_file, **common)


def check_vocabulary(source: TrainedLM, datamodule: L.LightningDataModule) -> None:
    """The data's token ids must be the checkpoint's: the same vocabulary, or the data's rounded up to a multiple of
    64 for speed (nanoGPT's 50,304 for GPT-2's 50,257). Fine-tuned on another vocabulary's ids a model learns a new
    language and its loss still falls (a 50,257-token model on character ids: 10.8 -> 3.9), so nothing else warns."""
    model_vocab, data_vocab = int(source.hparams["vocab_size"]), getattr(datamodule, "vocab_size", None)
    if data_vocab is None:
        raise UserInputError(f"remove-norms: the data ({type(datamodule).__name__}) declare no vocabulary; give "
                             f"token data (--shards, or a recipe whose data is a TextDataModule)")
    data_vocab = int(data_vocab)
    padded = model_vocab > data_vocab and model_vocab % 64 == 0 and model_vocab - data_vocab < 64
    if model_vocab != data_vocab and not padded:
        raise UserInputError(f"remove-norms: {source.path} has a vocabulary of {model_vocab} tokens but the data "
                             f"have {data_vocab}; give the data it was trained with (--shards made with its "
                             f"tokenizer, or --config its recipe)")


@one_line_errors
def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="cli.py remove-norms", description=(
        "Fine-tune a trained pre-LayerNorm GPT while its LayerNorms are removed one by one on the schedule of "
        "Baroni et al. 2025, then write it as a lnfree checkpoint (no normalisation left)."))
    parser.add_argument("checkpoint", help="a LanguageModel checkpoint with norm: layernorm (fit, or import-hf)")
    parser.add_argument("--out", required=True, help="where to write the LayerNorm-free checkpoint")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (reference: 300, GPT-2 Small)")
    parser.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (the reference's 6e-4)")
    parser.add_argument("--min-lr", type=float, default=3e-4, help="where the cosine ends (the reference's 3e-4)")
    parser.add_argument("--warmup", type=int, default=20, help="warmup steps (the reference's 20)")
    parser.add_argument("--config", default=None, help="a recipe whose data section gives the data (e.g. shards)")
    parser.add_argument("--shards", default=None, help="a directory of token shards (cli.py prepare-data, llm.c)")
    parser.add_argument("--tokenizer", default=None, help="the shards' tokenizer.json (default: meta.json's)")
    parser.add_argument("--text-file", default=None, help="char-level text (default: the embedded tinyshakespeare)")
    parser.add_argument("--block-size", type=int, default=None, help="context (default: the checkpoint's)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per micro-batch and process")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true",
                        help="bf16-mixed: the forward under bf16 autocast, weights and optimizer in fp32")
    parser.add_argument("--accelerator", default="auto", help="cpu, gpu, ... (Lightning's)")
    parser.add_argument("--devices", type=int, default=1, help="processes (DDP when more than one)")
    parser.add_argument("--strategy", default="auto", help="Lightning strategy (default: ddp for several devices)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data order")
    parser.add_argument("--val-batches", type=int, default=None, help="validation batches (default: the whole split)")
    parser.add_argument("--control", action="store_true",
                        help="also fine-tune with the norms kept (the paper's vanilla fine-tune) and report its loss")
    parser.add_argument("--json", default=None, help="also write the losses to this JSON file")
    args = parser.parse_args(argv)
    for flag in ("batch_size", "accumulate", "devices"):
        if getattr(args, flag) < 1:
            raise UserInputError(f"remove-norms: --{flag.replace('_', '-')} must be at least 1, got "
                                 f"{getattr(args, flag)}")

    source = read_trained_lm(args.checkpoint, "remove-norms")
    check_removable(source)
    schedule = RemovalSchedule(source.arch.n_layers)
    if args.steps <= schedule.final():
        raise UserInputError(f"remove-norms: --steps {args.steps} ends before the last norm goes fake at step "
                             f"{schedule.final()} ({source.arch.n_layers} blocks); give more steps")
    context = int(source.hparams["block_size"])
    block_size = args.block_size or context
    if not 1 <= block_size <= context:
        raise UserInputError(f"remove-norms: --block-size {block_size} is outside the checkpoint's context "
                             f"1..{context}")
    datamodule = datamodule_for(args, block_size)
    check_vocabulary(source, datamodule)
    datamodule.setup("fit")
    options = RunOptions(steps=args.steps, seed=args.seed, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
                         accumulate=args.accumulate, precision=args.precision, accelerator=args.accelerator,
                         devices=args.devices, strategy=args.strategy)

    lnfree, trainer = finetune(source, datamodule, options, remove=True)
    device = trainer.strategy.root_device  # the evaluations below are spread over the fine-tune's processes
    tokens_per_step = args.batch_size * args.accumulate * trainer.world_size * block_size
    report = {"checkpoint": str(source.path), "seed": args.seed, "steps": args.steps,
              "tokens_per_step": tokens_per_step, "precision": args.precision,
              "lnfree": validation_loss(lnfree, datamodule, args.val_batches, device)}
    exported = export_lnfree(source, lnfree)
    report["exported"] = validation_loss(exported, datamodule, args.val_batches, device)
    report["before"] = validation_loss(source.load(), datamodule, args.val_batches, device)
    if not math.isclose(report["exported"], report["lnfree"], rel_tol=1e-4, abs_tol=1e-4):
        raise UserInputError(f"remove-norms: the exported model's loss {report['exported']:.5f} differs from the "
                             f"fine-tuned one's {report['lnfree']:.5f}; nothing written")
    if args.control:
        control, _ = finetune(source, datamodule, options, remove=False)
        report["control"] = validation_loss(control, datamodule, args.val_batches, device)
    if trainer.global_rank != 0:
        return 0  # every rank computed the same report; one writes it
    out = write_lm_checkpoint(source, exported, exported.hparams.arch, args.out)
    line = (f"val loss before {report['before']:.4f}, LayerNorm-free after {args.steps} steps of {tokens_per_step:,} "
            f"tokens {report['lnfree']:.4f}")
    if args.control:
        line += f", norms kept {report['control']:.4f} (LN-free - kept: {report['lnfree'] - report['control']:+.4f})"
    print(f"wrote {out} (norm lnfree): {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
