"""Do issue 43's rewritten plugins train to the same losses as before? A 4-seed sweep, one commit per run.

Issue 43 rewrote plugins for speed (AttnRes, hyper-connections, mHC, PRepBN, Pre-RMSNorm and Pre-CRMSNorm, 3PT, the
hypersphere norm, PowerNorm, SeeDNorm, SSNorm on native ops; UN and LAUREL with fewer ops; Muon batched; Pattention's
Θ as one autograd node; the nGPT normalisation and lerp with written-out backwards) on the promise that the math
does not change. Each rewrite has an equality test of one forward and backward; this trains. Per contender and
seed (0-3): the reproduction's text model (``plugin_step_cpu``'s size: d 128, 8 layers, 4 heads, 16 x 64 tokens;
3PT at its recipe's d 192, 6 heads) built from the seed, ``--steps`` steps of the project's optimizer (AdamW, or
Muon for its row; lr 2e-3, weight decay 0.1, betas (0.9, 0.95), gradient norm clipped to 1.0 as the recipe does) on
tinyshakespeare batches drawn from the seed, fp32 as a CPU fit runs, then the loss on one fixed held-out batch (the
last 10% of the corpus) in eval mode: the seed's final loss. The baseline runs too, as the control (nothing in its
path changed). Everything is deterministic on one machine and thread count, so two commits' runs compare number for
number.

    python -m benchmarks.rewrite_equality --json /tmp/after.json            # here (HEAD)
    (cd /tmp/before && python -m benchmarks.rewrite_equality --json /tmp/before.json)   # a copy in a worktree
    python -m benchmarks.rewrite_equality --compare /tmp/before.json /tmp/after.json    # the table
    python -m benchmarks.rewrite_equality --nudge --json /tmp/nudged.json   # then --compare /tmp/after.json it:
                                                                           # what rounding alone makes

Like ``plugin_step_cpu`` it imports only what fe45656 (before the rewrites) already had, so a copy runs there.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.plugin_step_cpu import BASELINE, SHAPES, contenders, provenance
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "lit" / "data" / "tinyshakespeare.txt"
REWRITTEN = ("norm=3pt", "norm=hypersphere", "norm=powernorm", "norm=precrmsnorm", "norm=prermsnorm", "norm=prepbn",
             "norm=seednorm", "norm=ssnorm", "norm=un", "residual=attnres", "residual=attnres_block",
             "residual=hyperconn", "residual=hyperconn_static", "residual=laurel_rw_lr_pa", "residual=mhc",
             "optimizer=muon", "recipe=gpt_ngpt", "projection=pattention")
SEEDS = (0, 1, 2, 3)
TOLERANCE = 1e-4  # issue 43: the same per-seed losses as before to 1e-4
LR, WEIGHT_DECAY, BETAS, CLIP = 2e-3, 0.1, (0.9, 0.95), 1.0
HELD_OUT = 0.1  # the corpus's last 10%: the final loss's batch, never trained on


def corpus() -> torch.Tensor:
    """tinyshakespeare as character ids (sorted characters: 65 of them), as the text data module reads it."""
    text = CORPUS.read_text(encoding="utf-8")
    ids = {ch: i for i, ch in enumerate(sorted(set(text)))}
    return torch.tensor([ids[ch] for ch in text], dtype=torch.long)


def batch(data: torch.Tensor, rows: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - seq - 1, (rows,), generator=generator)
    window = torch.stack([data[s:s + seq + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]


def nudge_one_ulp_(model: torch.nn.Module, seed: int = 99) -> None:
    """Move every weight by one ulp, up or down at random: a change of rounding and nothing else, to see how far
    training carries it (the reference for differences between two commits that compute alike but round apart)."""
    directions = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            sign = torch.randint(0, 2, p.shape, generator=directions).to(p.dtype) * 2 - 1
            p.copy_(torch.nextafter(p, p + sign))


def train(spec: dict, seed: int, steps: int, data: torch.Tensor, nudge: bool = False) -> dict:
    """One seed's run: the training loss at every step and the final held-out loss (``nudge``: from an init moved
    one ulp, ``nudge_one_ulp_``)."""
    from arch_plugins import registry
    from benchmarks.gpu_check.models import build_ours
    from benchmarks.gpu_check.plugins import after_step_of

    shape = spec["shape"]
    split = int(len(data) * (1 - HELD_OUT))
    model = build_ours(shape, torch.device("cpu"), seed=seed, **spec["arch"])
    if nudge:
        nudge_one_ulp_(model)
    opt = registry.create("optimizer", spec["optimizer"]).build(model, lr=LR, weight_decay=WEIGHT_DECAY,
                                                                  betas=BETAS)
    after_step = after_step_of(model)
    draws = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        x, y = batch(data[:split], shape.batch, shape.seq, draws)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        x, y = batch(data[split:], shape.batch, shape.seq, torch.Generator().manual_seed(0))
        final = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    return {"train_losses": losses, "final_loss": final}


def sweep(labels: list[str], steps: int, progress=print, nudge: bool = False) -> dict:
    todo = contenders(SHAPES["reproduction"])
    data = corpus()
    out = {}
    for label in labels:
        started = time.perf_counter()
        spec = todo[label]
        try:
            out[label] = {str(seed): train(spec, seed, steps, data, nudge) for seed in SEEDS}
        except Exception as exc:  # a plugin that fails at one commit is reported, the others still run
            out[label] = {"status": "failed", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
        progress(f"{label}: " + (", ".join(f"seed {s} {r['final_loss']:.6f}" for s, r in out[label].items())
                                 if "status" not in out[label] else out[label]["error"])
                 + f" ({time.perf_counter() - started:.0f} s)")
    return out


def first_difference(before: list[float], after: list[float], tolerance: float) -> int | None:
    """The first step (1-based) whose training losses differ by more than ``tolerance``, or None."""
    return next((i + 1 for i, (b, a) in enumerate(zip(before, after, strict=True)) if abs(b - a) > tolerance), None)


def compare(before: dict, after: dict, tolerance: float = TOLERANCE) -> tuple[str, list[str]]:
    """The Markdown table (per contender: each seed's final loss after, |after - before| per seed, the largest
    training-loss difference over the steps and the first step it passed 1e-6) and the contenders that differ
    by more than ``tolerance`` in a final loss."""
    lines = ["| contender | final loss after, seeds " + ", ".join(map(str, SEEDS)) + " | abs. difference from "
             "before, per seed | largest training-loss difference (first step > 1e-6) | same to "
             f"{tolerance:g} |", "|---|---|---|---|---|"]
    differ = []
    rb, ra = before["runs"], after["runs"]
    for label in ra:
        b, a = rb.get(label), ra[label]
        if b is None or "status" in a or "status" in b:
            why = "not run before" if b is None else (a.get("error") or b.get("error"))
            lines.append(f"| `{label}` | {why} | | | |")
            continue
        seeds = [str(s) for s in SEEDS]
        gaps = [abs(a[s]["final_loss"] - b[s]["final_loss"]) for s in seeds]
        step_gaps = [max(abs(x - y) for x, y in zip(a[s]["train_losses"], b[s]["train_losses"], strict=True))
                     for s in seeds]
        firsts = [first_difference(b[s]["train_losses"], a[s]["train_losses"], 1e-6) for s in seeds]
        first = min((f for f in firsts if f is not None), default=None)
        same = max(gaps) <= tolerance
        if not same:
            differ.append(label)
        finals = ", ".join(f"{a[s]['final_loss']:.5f}" for s in seeds)
        lines.append(f"| `{label}` | {finals} | "
                     f"{', '.join(f'{g:.1e}' for g in gaps)} | {max(step_gaps):.1e}"
                     f"{'' if first is None else f' (step {first})'} | {'yes' if same else '**no**'} |")
    return "\n".join(lines) + "\n", differ


def _load(path: Path) -> dict:
    if not path.is_file():
        raise UserInputError(f"{path} does not exist; write it with `python -m benchmarks.rewrite_equality --json "
                             f"{path}`")
    return json.loads(path.read_text())


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(prog="python -m benchmarks.rewrite_equality", description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", metavar="LABEL", help=f"these contenders (default: the baseline and "
                                                             f"{len(REWRITTEN)} rewritten)")
    p.add_argument("--steps", type=int, default=20, help="training steps per seed (default 20)")
    p.add_argument("--json", type=Path, help="write the losses here")
    p.add_argument("--nudge", action="store_true",
                   help="start from every initial weight moved one ulp: --compare against a plain run of the same "
                        "commit shows how far rounding alone carries in --steps steps")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                   help="train nothing: the table of two runs' JSON files")
    args = p.parse_args(argv)
    if args.compare:
        before, after = (_load(path) for path in args.compare)
        if before.get("steps") != after.get("steps"):
            raise UserInputError(f"the two runs trained {before.get('steps')} and {after.get('steps')} steps; run "
                                 "both with the same --steps")
        table, differ = compare(before, after)
        print(table + (f"\nDiffer by more than {TOLERANCE:g}: {', '.join(differ)}\n" if differ else ""), end="")
        return 0
    labels = args.only or [BASELINE, *REWRITTEN]
    known = contenders(SHAPES["reproduction"])
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise UserInputError(f"unknown contender {', '.join(map(repr, unknown))}; give labels from: "
                             f"{', '.join(known)}")
    if args.steps < 1:
        raise UserInputError(f"--steps must be at least 1 (got {args.steps})")
    torch.set_num_threads(1)  # the summation order: two runs compare number for number at one thread count
    import arch_plugins

    result = provenance() | {"source": str(Path(arch_plugins.__file__).resolve().parents[1]), "steps": args.steps,
                             "nudge": args.nudge,
                             "runs": sweep(labels, args.steps,
                                           progress=lambda line: print(line, file=sys.stderr, flush=True),
                                           nudge=args.nudge)}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
