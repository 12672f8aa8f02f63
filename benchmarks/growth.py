"""TokenFormer growth on tinyshakespeare: train small, grow to 2x the parameter tokens, go on; versus
training the large model from scratch. Reports the compute each needs to reach the same val loss.

Compute is counted as Σ steps x non-embedding parameters of the model trained at that step (the
model FLOPs are ~6 x params x tokens, and every step sees the same tokens), plus wall time. The
target is the val loss the large model reaches at the end of its scratch run. Growth uses the
function-preserving default (zero new keys, scale kept at sqrt(n_old)) and a fresh optimizer.

    python -m benchmarks.growth                     # writes benchmarks/results/growth.{json,png}
    python -m benchmarks.growth --small-steps 100 --grown-steps 100 --large-steps 200   # quicker
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from lit.data.text import TextDataModule
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig

OUT = Path(__file__).parent / "results"


class ValCurve(L.Callback):
    def __init__(self):
        self.points: list[tuple[int, float, float]] = []  # (step, val loss, train wall seconds so far)
        self.start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.points.append((trainer.global_step, float(trainer.callback_metrics["val/loss"]),
                                time.perf_counter() - self.start))


def arch(tokens: int) -> TransformerConfig:
    return TransformerConfig(d_model=128, n_layers=4, n_heads=4, norm="layernorm_nonparam", projection="pattention",
                             projection_options={"tokens_qkv": tokens, "tokens_out": tokens, "tokens_ffn": 4 * tokens})


def train(tokens: int, steps: int, args, init_from: str | None = None, save: str | None = None):
    torch.manual_seed(args.seed)
    data = TextDataModule(block_size=args.block, batch_size=args.batch)
    model = LanguageModel(data.vocab_size, args.block, arch(tokens), tie_embeddings=True, lr=args.lr,
                          warmup_steps=args.warmup, init_from=init_from)
    curve = ValCurve()
    trainer = L.Trainer(max_steps=steps, val_check_interval=args.val_every, check_val_every_n_epoch=None,
                        limit_val_batches=args.val_batches, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        num_sanity_val_steps=0, callbacks=[curve])
    trainer.validate(model, data, verbose=False)  # the curve's step 0 (grown model: equal to the small one's end)
    trainer.fit(model, data)
    if save:
        trainer.save_checkpoint(save)
    params = sum(p.numel() for n, p in model.model.named_parameters() if n.startswith("stack."))
    return curve.points, params


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("small_tokens", 64), ("small_steps", 300), ("grown_steps", 300), ("large_steps", 600),
                          ("block", 128), ("batch", 16), ("val_every", 50), ("val_batches", 8), ("warmup", 30),
                          ("seed", 1337)]:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=default)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    n = args.small_tokens
    ckpt = str(Path(tempfile.mkdtemp()) / "growth_small.ckpt")
    small, small_params = train(n, args.small_steps, args, save=ckpt)
    grown, large_params = train(2 * n, args.grown_steps, args, init_from=ckpt)
    scratch, _ = train(2 * n, args.large_steps, args)

    # One axis for both: cumulative compute (params x steps) and wall time.
    small_wall = small[-1][2]
    staged = [(s, loss, small_params * s, w) for s, loss, w in small]
    staged += [(args.small_steps + s, loss, small_params * args.small_steps + large_params * s, small_wall + w)
               for s, loss, w in grown[1:]]
    direct = [(s, loss, large_params * s, w) for s, loss, w in scratch]
    target = scratch[-1][1]
    first = lambda curve: next(((s, c, w) for s, loss, c, w in curve if loss <= target), None)
    result = {"config": vars(args), "params": {"small": small_params, "large": large_params},
              "grown_loss_at_growth": grown[0][1], "small_final_loss": small[-1][1], "target_val_loss": target,
              "staged": staged, "scratch": direct, "staged_reaches_target": first(staged),
              "scratch_reaches_target": first(direct)}
    (OUT / "growth.json").write_text(json.dumps(result, indent=1))
    print(f"params (non-embedding): small {small_params:,}, large {large_params:,}")
    print(f"val loss at growth: small {small[-1][1]:.4f} -> grown {grown[0][1]:.4f} (preserved function)")
    print(f"target (large from scratch after {args.large_steps} steps): {target:.4f}")
    for name, hit in (("grow", result["staged_reaches_target"]), ("scratch", result["scratch_reaches_target"])):
        print(f"{name}: " + (f"reaches it at step {hit[0]}, compute {hit[1] / 1e9:.2f} G param-steps, {hit[2]:.0f} s"
                             if hit else "does not reach it"))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib missing: no plot (pip install -e ".[bench]")')
        return result
    fig, ax = plt.subplots(figsize=(6, 4))
    for curve, style, label in ((staged, "o-", f"{n} tokens, grown to {2 * n}"),
                                (direct, "s-", f"{2 * n} tokens from scratch")):
        ax.plot([c / 1e9 for _, _, c, _ in curve], [loss for _, loss, _, _ in curve], style, label=label)
    ax.axvline(small_params * args.small_steps / 1e9, color="grey", ls=":", label="growth")
    ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("compute (G param-steps, non-embedding)")
    ax.set_ylabel("val loss (tinyshakespeare, char)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "growth.png", dpi=120)
    print(f"wrote {OUT / 'growth.png'}")
    return result


if __name__ == "__main__":
    main()
