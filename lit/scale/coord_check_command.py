"""``python cli.py coord-check``: the coordinate check of a GPT recipe's parametrization, its figure and slopes.

    python cli.py coord-check --config recipes/gpt_mup.yaml --widths 64,128,256,512,1024 --steps 10 --seeds 3
    python cli.py coord-check --config recipes/gpt_mup.yaml --parametrization sp --widths 32,64,128,256
    python cli.py coord-check --config RECIPE --depths 2,4,8,16 --parametrization completep \\
        --parametrization_options "{base_width: 32, base_heads: 2, base_depth: 2}"
    python cli.py coord-check --config recipes/gpt_mup.yaml --widths 32,64,128,256 --optimizer muon \
        --optimizer_options "{lr: 0.02}"

Trains the recipe's architecture at each width (or depth) for ``--steps`` optimizer steps (AdamW, or
``--optimizer``) at a constant learning rate on the recipe's text (the embedded corpus by default), from the same
seeds and batches at every shape, and records every sublayer's output RMS and its change since init
(``lit/scale/coord_check.py``). Prints the slope of each line on log-log axes and draws the figure; exits 1 when a
slope lies outside ``--band`` (0 otherwise).
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

import yaml

from lit.errors import OneLineArgumentParser, UserInputError

DEFAULT_OUT = Path("coord_check")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 32,64,128; got {text!r}") from None
    if len(values) < 2 or any(v < 1 for v in values) or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected at least two increasing positive integers; got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="cli.py coord-check", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a GPT recipe (lit.language_model.LanguageModel)")
    axis = p.add_mutually_exclusive_group(required=True)
    axis.add_argument("--widths", type=_ints, help="d_model values, e.g. 64,128,256,512,1024")
    axis.add_argument("--depths", type=_ints, help="n_layers values at the recipe's width, e.g. 2,4,8,16")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps before the measurement (default 10)")
    p.add_argument("--seeds", type=int, default=3, help="seeds averaged per shape (default 3)")
    p.add_argument("--lr", type=float, default=None, help="constant learning rate (default: the recipe's)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--parametrization", default=None, help="replace the recipe's (its options then reset)")
    p.add_argument("--parametrization_options", default=None,
                   help="YAML mapping, e.g. '{base_width: 32, base_heads: 2}'")
    p.add_argument("--optimizer", default="adamw",
                   help="optimizer plugin (default adamw; muon: Muon on hidden matrices, AdamW at --lr for the rest)")
    p.add_argument("--optimizer_options", default=None, help="YAML mapping, e.g. '{lr: 0.02}' for muon")
    p.add_argument("--band", type=float, default=0.1, help="|slope| allowed (default 0.1)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for coord_check.png and slopes.txt")
    return p


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        return run(args)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    except UserInputError as exc:
        sys.stderr.write(f"error: {' '.join(str(exc).split())}\n")
        return 2


def _setup(args: argparse.Namespace):
    import torch

    from lit.data.text import CharTokenizer
    from lit.models.transformer import TransformerConfig
    from lit.scale.coord_check import CoordCheckSetup

    path = Path(args.config)
    if not path.is_file():
        raise UserInputError(f"recipe {path} not found; pass an existing YAML file to --config")
    recipe = yaml.safe_load(path.read_text()) or {}
    model = recipe.get("model") or {}
    if not str(model.get("class_path", "")).endswith("LanguageModel"):
        raise UserInputError(f"{path} is not a GPT recipe (model.class_path {model.get('class_path')!r}); the "
                             "coordinate check trains lit.language_model.LanguageModel recipes")
    init = model.get("init_args") or {}
    data = ((recipe.get("data") or {}).get("init_args")) or {}
    if data.get("shards_dir"):
        raise UserInputError("the coordinate check trains on a char-level text (the embedded corpus or "
                             "data.text_file), not token shards; use a recipe without data.shards_dir")
    arch = dict(init.get("arch") or {})
    if args.parametrization is not None:
        arch["parametrization"], arch["parametrization_options"] = args.parametrization, {}
    if args.parametrization_options is not None:
        options = yaml.safe_load(args.parametrization_options)
        if not isinstance(options, dict):
            raise UserInputError(f"--parametrization_options must be a YAML mapping like '{{base_width: 32}}', got "
                                 f"{args.parametrization_options!r}")
        arch["parametrization_options"] = options
    try:
        config = TransformerConfig(**arch)
    except TypeError as exc:
        raise UserInputError(f"{path}: model.init_args.arch: {exc}") from exc
    if data.get("text_file"):
        text = Path(data["text_file"]).read_text(encoding="utf-8")
    else:
        text = resources.files("lit.data").joinpath("tinyshakespeare.txt").read_text(encoding="utf-8")
    tokenizer = CharTokenizer(text)
    optimizer_options = yaml.safe_load(args.optimizer_options) if args.optimizer_options is not None else None
    if optimizer_options is not None and not isinstance(optimizer_options, dict):
        raise UserInputError(f"--optimizer_options must be a YAML mapping like '{{lr: 0.02}}', got "
                             f"{args.optimizer_options!r}")
    if args.steps < 1 or args.seeds < 1:
        raise UserInputError("--steps and --seeds must be at least 1")
    return CoordCheckSetup(config, torch.tensor(tokenizer.encode(text)), tokenizer.vocab_size,
                           block_size=args.block_size, batch_size=args.batch_size,
                           lr=args.lr if args.lr is not None else float(init.get("lr", 1e-3)),
                           betas=tuple(init.get("betas", (0.9, 0.95))), weight_decay=0.0, steps=args.steps,
                           optimizer=args.optimizer, optimizer_options=optimizer_options)


def run(args: argparse.Namespace) -> int:
    from arch_plugins.registry import PluginError
    from lit.scale.coord_check import coord_check, format_slopes

    setup = _setup(args)
    try:
        check = coord_check(setup, widths=args.widths, depths=args.depths, seeds=range(args.seeds))
    except PluginError as exc:
        raise UserInputError(str(exc)) from exc
    slopes = check.slopes()
    outside = {key: s for key, s in slopes.items() if abs(s) > args.band}
    name = setup.arch.parametrization
    summary = (f"coordinate check of {args.config} under {name} ({check.axis} {check.shapes[0]}..{check.shapes[-1]}, "
               f"{args.steps} {args.optimizer} steps at lr {setup.lr:g}, {args.seeds} seeds)\n{format_slopes(check)}\n"
               + (f"{len(outside)} of {len(slopes)} slopes outside +-{args.band}: "
                  + ", ".join(f"{q}/{s}" for q, s in sorted(outside)) if outside
                  else f"every slope within +-{args.band}"))
    print(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slopes.txt").write_text(summary + "\n")
    draw(check, args.out / "coord_check.png", title=f"{name}: {Path(args.config).name}")
    print(f"figure: {args.out / 'coord_check.png'}")
    return 1 if outside else 0


def draw(check, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit.scale.coord_check import QUANTITIES

    slopes = check.slopes()
    sites = list(dict.fromkeys(site for _, site in check.values))  # the fixed sites, then every pre:<role>
    fig, axes = plt.subplots(1, len(QUANTITIES), figsize=(11, 4), squeeze=False)
    names = {"act": "output RMS after the steps", "delta": "RMS of the change since init"}
    for ax, quantity in zip(axes[0], QUANTITIES, strict=True):
        for site in sites:
            ax.plot(check.shapes, check.values[quantity, site], marker="o",
                    label=f"{site} ({slopes[quantity, site]:+.2f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(check.axis)
        ax.set_title(f"{title}\n{names[quantity]}", fontsize=9)
        ax.legend(fontsize=7, title="site (slope)", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
