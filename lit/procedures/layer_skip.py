"""``cli.py layer-skip``: how a trained model uses its depth. The validation loss (and, for classifiers, the top-1
accuracy) with each block skipped, each attention sublayer skipped and each MLP sublayer skipped, one at a time,
and how far the output distribution moves: the KL divergence KL(p_full || p_skipped) of the skipped model's
predictive distribution from the full model's, in nats per prediction (per token for a language model, per image
for a classifier), averaged over the validation set.

    python cli.py layer-skip CKPT [--config RECIPE] [--val-batches N] [--out layer_skip.png]

What "skip" means, for every residual type alike: the skipped sublayer's branch (its output after its ``*_out``
site, what the residual merge adds to the stream) is replaced by zeros where it enters the merge; the merge, the
``*_after_add`` site and the residual history run as usual. Skipping a block skips both its sublayers. With the
plain residual and pre-norm this is exactly "the block returns its input" (h + 0 = h). With a residual that has more
than one stream or looks back (hyper-connections, Attention Residuals, LAUREL) the merge still mixes and carries
the streams it always does; only the sublayer's contribution is removed, which is what skipping a sublayer can
mean when the merge is more than an addition (hyper-connections still mix the n streams; an Attention Residuals
block that is skipped contributes a zero source to the later depth attentions; LAUREL's learned low-rank path on
the stream stays). With post-norm (an ``*_after_add`` norm) the stream is still normalised after a skipped
sublayer. A merge that fuses its tail (nGPT) is run unfused while its branch is zeroed: the unfused path is the
function the fused one computes, by the interface's contract. Nothing is skipped for the ``none`` row: its loss is
the checkpoint's own, the same number ``cli.py validate`` gives on the same batches.

Data: the recipe's ``data`` section (``--config``, the recipe the checkpoint was trained with); a language model
without one reads the embedded corpus at the checkpoint's block size. The batches are the validation split's
first ``--val-batches`` (default: the recipe's ``trainer.limit_val_batches`` when it is a count, else all).
"""

from __future__ import annotations

import argparse
import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.procedures.checkpoint_io import load_trained_task, recipe_datamodule

SUBLAYERS = ("attn", "mlp")


@dataclass(frozen=True)
class Skip:
    """One row: what is skipped, as (block index, sublayer) pairs; none for the full model."""

    label: str
    kind: str  # "none", "block", "attn" or "mlp"
    block: int | None
    sublayers: tuple[tuple[int, str], ...]


def skips(n_layers: int) -> list[Skip]:
    """The full model, then every block, every attention sublayer and every MLP sublayer, one at a time."""
    rows = [Skip("none", "none", None, ())]
    rows += [Skip(f"block {i}", "block", i, ((i, "attn"), (i, "mlp"))) for i in range(n_layers)]
    rows += [Skip(f"{sub} {i}", sub, i, ((i, sub),)) for sub in SUBLAYERS for i in range(n_layers)]
    return rows


def _zero_branch(merge: nn.Module, args: tuple) -> tuple:
    h, branch, *rest = args
    return (h, torch.zeros_like(branch), *rest)


@contextlib.contextmanager
def skipping(stack: nn.Module, sublayers: tuple[tuple[int, str], ...]):
    """While inside: each listed sublayer's branch enters its merge as zeros (forward pre-hooks on the merges,
    removed on exit; fused tails run unfused meanwhile)."""
    handles, unfused = [], []
    try:
        for index, sublayer in sublayers:
            block = stack.blocks[index]
            if getattr(block, f"{sublayer}_fused"):
                setattr(block, f"{sublayer}_fused", False)
                unfused.append((block, sublayer))
            handles.append(getattr(block, f"{sublayer}_merge").register_forward_pre_hook(_zero_branch))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for block, sublayer in unfused:
            setattr(block, f"{sublayer}_fused", True)


@dataclass
class Tally:
    """Sums over the validation batches, each batch weighted by its number of samples (as Lightning weights
    ``val/loss``), and the KL summed per prediction."""

    loss: float = 0.0
    samples: int = 0
    correct: int = 0
    kl: float = 0.0
    predictions: int = 0

    def add(self, logits: torch.Tensor, full_log_probs: torch.Tensor, targets: torch.Tensor) -> None:
        flat = logits.float().reshape(-1, logits.shape[-1])
        samples = targets.shape[0]
        self.loss += float(F.cross_entropy(flat, targets.reshape(-1))) * samples
        self.samples += samples
        self.correct += int((flat.argmax(-1) == targets.reshape(-1)).sum())
        log_probs = flat.log_softmax(-1)
        self.kl += float(F.kl_div(log_probs, full_log_probs, log_target=True, reduction="sum"))
        self.predictions += flat.shape[0]


@dataclass
class Row:
    skip: Skip
    loss: float
    accuracy: float
    kl: float
    delta: float = field(default=math.nan)


def find_stack(module: nn.Module) -> nn.Module:
    from lit.diagnostics.probe import find_stack as find

    stack = find(module)
    if stack is None:
        raise UserInputError("layer-skip: the checkpoint's model has no transformer stack to skip blocks of")
    return stack


@torch.no_grad()
def measure(module: nn.Module, batches, device: torch.device | str = "cpu") -> list[Row]:
    """One row per ``skips`` entry over ``batches`` of (inputs, targets); a row's ``accuracy`` is the top-1
    accuracy of its predictions (per image for a classifier, per token for a language model)."""
    module.eval().to(device)
    stack = find_stack(module)
    plan = skips(len(stack.blocks))
    tallies = [Tally() for _ in plan]
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        full = module(inputs)
        full_log_probs = full.float().reshape(-1, full.shape[-1]).log_softmax(-1)
        for skip, tally in zip(plan, tallies, strict=True):
            if skip.sublayers:
                with skipping(stack, skip.sublayers):
                    logits = module(inputs)
            else:
                logits = full
            tally.add(logits, full_log_probs, targets)
    if not tallies[0].samples:
        raise UserInputError("layer-skip: the validation split gave no batch; check --val-batches and the data")
    rows = [Row(skip, t.loss / t.samples, t.correct / t.predictions, t.kl / t.predictions)
            for skip, t in zip(plan, tallies, strict=True)]
    for row in rows:
        row.delta = row.loss - rows[0].loss
    return rows


def table(rows: list[Row], accuracy: bool) -> str:
    """A Markdown table (readable in a terminal too)."""
    head = "| skipped | val loss | Δ loss | KL(full ‖ skipped) |" + (" top-1 acc |" if accuracy else "")
    rule = "|---|---:|---:|---:|" + ("---:|" if accuracy else "")
    lines = [head, rule]
    for r in rows:
        line = f"| {r.skip.label} | {r.loss:.4f} | {r.delta:+.4f} | {r.kl:.4g} |"
        lines.append(line + (f" {r.accuracy:.4f} |" if accuracy else ""))
    return "\n".join(lines)


def draw(rows: list[Row], path: Path, title: str) -> Path:
    """Δ loss and KL against the skipped block's index: one line each for blocks, attention and MLP sublayers."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    panels = fig.subplots(1, 2)
    styles = {"block": ("o", "black"), "attn": ("s", "tab:blue"), "mlp": ("^", "tab:orange")}
    for ax, value, label in ((panels[0], "delta", "Δ val loss (nats)"), (panels[1], "kl", "KL(full ‖ skipped)")):
        for kind, (marker, color) in styles.items():
            series = [r for r in rows if r.skip.kind == kind]
            ax.plot([r.skip.block for r in series], [getattr(r, value) for r in series], marker=marker,
                    color=color, label=f"skip {kind}" if kind != "block" else "skip block")
        ax.set(xlabel="block index", ylabel=label)
        ax.set_xticks(sorted({r.skip.block for r in rows if r.skip.block is not None}))
        ax.grid(alpha=0.3)
        if value == "kl" and min(getattr(r, value) for r in rows if r.skip.block is not None) > 0:
            ax.set_yscale("log")  # KL spans decades; a zero line has no place on it
        else:
            ax.axhline(0, color="grey", linewidth=0.8)
    panels[0].legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def read_recipe(path: str) -> dict:
    import yaml

    recipe_path = Path(path)
    if not recipe_path.is_file():
        raise UserInputError(f"layer-skip: recipe not found: {recipe_path} (give the YAML the checkpoint was trained "
                             f"with to --config)")
    recipe = yaml.safe_load(recipe_path.read_text()) or {}
    if not isinstance(recipe, dict):
        raise UserInputError(f"layer-skip: {recipe_path} is not a recipe (a YAML mapping with a data section)")
    return recipe


def datamodule_for(hparams: dict, recipe: dict | None):
    """The recipe's DataModule, or the embedded corpus at the checkpoint's block size for a language model."""
    data = (recipe or {}).get("data")
    if isinstance(data, dict) and "class_path" in data:
        return recipe_datamodule(data, "layer-skip")
    if "block_size" in hparams and "vocab_size" in hparams:
        from lit.data import TextDataModule

        return TextDataModule(block_size=int(hparams["block_size"]))
    raise UserInputError("layer-skip: this checkpoint is not a language model; give the recipe it was trained with "
                         "(--config RECIPE) so that its validation data can be read")


def default_batches(recipe: dict | None) -> int | None:
    limit = ((recipe or {}).get("trainer") or {}).get("limit_val_batches")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def first(loader, n: int | None):
    for i, batch in enumerate(loader):
        if n is not None and i >= n:
            return
        yield batch


@one_line_errors
def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="cli.py layer-skip", description=(
        "Validation loss (and accuracy for classifiers) of a trained checkpoint with each block, each attention "
        "sublayer and each MLP sublayer skipped in turn (its branch zeroed before the residual merge), and "
        "KL(full || skipped) of the predictions; prints a table and draws a figure."))
    parser.add_argument("checkpoint", help="a checkpoint written by `cli.py fit` (GPT or ViT, any plugins)")
    parser.add_argument("--config", default=None, help="the recipe it was trained with (its data section is read)")
    parser.add_argument("--val-batches", type=int, default=None,
                        help="validation batches (default: the recipe's limit_val_batches, else all)")
    parser.add_argument("--out", default="layer_skip.png", help="where to draw the figure (PNG)")
    parser.add_argument("--device", default="cpu", help="torch device to run on (cpu, cuda, ...)")
    args: argparse.Namespace = parser.parse_args(argv)
    if args.val_batches is not None and args.val_batches < 1:
        raise UserInputError(f"layer-skip: --val-batches must be >= 1, got {args.val_batches}")
    module, hparams = load_trained_task(args.checkpoint, "layer-skip")
    recipe = read_recipe(args.config) if args.config else None
    datamodule = datamodule_for(hparams, recipe)
    datamodule.setup("validate")
    n_batches = args.val_batches if args.val_batches is not None else default_batches(recipe)
    rows = measure(module, first(datamodule.val_dataloader(), n_batches), args.device)
    classifier = "num_classes" in hparams  # accuracy is the classifier's own metric; a language model's is its loss
    print(table(rows, accuracy=classifier))
    checkpoint = Path(args.checkpoint)
    out = draw(rows, Path(args.out), f"layer-skip: {checkpoint.parent.name}/{checkpoint.name}")
    print(f"figure: {out}")
    return 0
