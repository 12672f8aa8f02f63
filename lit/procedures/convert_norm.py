"""``cli.py convert-norm``: a trained Pre-LN GPT checkpoint as Pre-RMSNorm or Pre-CRMSNorm, the same function.

Jiang et al. (NeurIPS 2023, ``ZixuanJiang/pre-rmsnorm-transformer``): with the main branch zero-mean,
LayerNorm equals RMSNorm, and RMSNorm of a zero-mean vector can be computed from all but one of its
coordinates. The conversion re-centres what writes to the stream (token and position embeddings along
d_model, the attention and MLP output projections along their output rows), which the reference also
does, and keeps each LayerNorm's gain and bias on the new norm (``affine: true``) where the reference
folds them into the next linear layer: the GPT head has no bias to receive the final norm's. One function
serves both targets; the logits of the converted model are compared with the original's before writing.

    python cli.py convert-norm CKPT --to precrmsnorm --out converted.ckpt

Pre-RMSNorm would not need the re-centring (its sites centre what is written), Pre-CRMSNorm does: it reads
only d-1 coordinates of a stream that must start zero-mean.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from torch import nn

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.language_model import LanguageModel
from lit.procedures.checkpoint_io import TrainedLM, arch_flags, read_trained_lm, write_lm_checkpoint

TARGETS = ("prermsnorm", "precrmsnorm")
# Logits of the converted model against the original's on random tokens, in fp32.
TOLERANCE = 1e-4


def check_convertible(source: TrainedLM, target: str) -> None:
    arch, what = source.arch, f"convert-norm: {source.path}"
    if target not in TARGETS:
        raise UserInputError(f"convert-norm: --to must be one of {', '.join(TARGETS)}, got {target!r}")
    if arch.norm != "layernorm":
        raise UserInputError(f"{what} uses norm {arch.norm!r}; convert-norm converts pre-LayerNorm checkpoints "
                             f"(norm: layernorm)")
    if arch.residual != "add":
        raise UserInputError(f"{what} uses residual {arch.residual!r}; the conversion is exact for the plain "
                             f"residual (add) only")
    if arch.projection != "linear":
        raise UserInputError(f"{what} uses projection {arch.projection!r}; re-centring the output projections "
                             f"needs dense ones (linear)")
    if source.hparams.get("tie_embeddings") and target == "precrmsnorm":
        raise UserInputError(f"{what} ties the head to the embedding; re-centring the embedding would change the "
                             f"head: precrmsnorm cannot convert it (prermsnorm can)")


@torch.no_grad()
def _centre_writers(model: nn.Module, tied: bool) -> None:
    """Make every vector written to the stream zero-mean along d_model (the reference's conversion)."""
    if not tied:
        model.tok.weight -= model.tok.weight.mean(dim=1, keepdim=True)
    if model.pos is not None:
        model.pos.weight -= model.pos.weight.mean(dim=1, keepdim=True)
    for block in model.stack.blocks:
        for linear in (block.attn.out, block.mlp.down):
            linear.weight -= linear.weight.mean(dim=0, keepdim=True)  # (d_model, d_in): rows are outputs
            if linear.bias is not None:
                linear.bias -= linear.bias.mean()


def convert(source: TrainedLM, target: str) -> tuple[LanguageModel, float]:
    """The converted LanguageModel and the largest logit difference against the original on random tokens."""
    check_convertible(source, target)
    ln = source.arch.norm_options
    affine = bool(ln.get("affine", True))
    arch = dataclasses.replace(source.arch, norm=target,
                               norm_options={"eps": float(ln.get("eps", 1e-5)), "affine": affine})
    original = source.load().eval()
    converted = source.build(arch).eval()
    state = dict(source.checkpoint["state_dict"])
    if affine and not ln.get("bias", True):  # LayerNorm without bias: the new norm's bias is zero
        for key in [k for k in converted.state_dict() if k.endswith(("attn_in.bias", "mlp_in.bias", "final.bias"))]:
            state[key] = torch.zeros_like(converted.state_dict()[key])
    converted.load_state_dict(state)
    _centre_writers(converted.model, bool(source.hparams.get("tie_embeddings")))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, original.model.vocab_size, (2, original.model.block_size), generator=g)
    difference = (converted(tokens).float() - original(tokens).float()).abs().max().item()
    return converted, difference


@one_line_errors
def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="cli.py convert-norm", description=(
        "Convert a trained pre-LayerNorm GPT checkpoint to Pre-RMSNorm or Pre-CRMSNorm (Jiang et al. 2023): the same "
        "function, checked on random tokens, written as a checkpoint that validate and fit --model.init_from read."))
    parser.add_argument("checkpoint", help="a LanguageModel checkpoint trained with norm: layernorm")
    parser.add_argument("--to", required=True, choices=TARGETS, help="the norm strategy to convert to")
    parser.add_argument("--out", required=True, help="where to write the converted checkpoint")
    args: argparse.Namespace = parser.parse_args(argv)
    source = read_trained_lm(args.checkpoint, "convert-norm")
    converted, difference = convert(source, args.to)
    if difference > TOLERANCE:
        raise UserInputError(f"convert-norm: the converted model's logits differ by {difference:.3g} "
                             f"(> {TOLERANCE:g}); nothing written")
    out = write_lm_checkpoint(source, converted, converted.hparams.arch, args.out)
    print(f"wrote {out}: norm {args.to}, max |logit difference| on random tokens {difference:.2e}")
    flags = arch_flags(converted.hparams.arch)
    print(f"train from it: python cli.py fit --config RECIPE --model.init_from={out} {flags}")
    return 0
