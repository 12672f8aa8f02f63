"""Training throughput of our ViT baseline against timm's VisionTransformer, same config, one process.

Both are the standard ViT (cls token, learned positions, pre-LayerNorm eps 1e-6, qkv/proj/MLP biases,
GELU MLP 4x), and tests/test_vit.py proves they compute the same function. Measured: images per
second of a training step (forward, cross-entropy, backward, AdamW), fp32 on the CPU.

    python -m benchmarks.vit_throughput                  # embed 192, depth 6, patch 4, 32 px, batch 64
    python -m benchmarks.vit_throughput --rounds 5 --steps 10
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from benchmarks.timing import Contender, report, run_rounds, training_step
from lit.models.vit import VIT_ARCH, ViT


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("embed", 192), ("depth", 6), ("heads", 3), ("patch", 4), ("image", 32), ("batch", 64),
                          ("classes", 100), ("steps", 8), ("rounds", 5), ("warmup", 3)]:
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, 3, args.image, args.image, generator=g)
    labels = torch.randint(args.classes, (args.batch,), generator=g)
    loss = lambda model: F.cross_entropy(model(images), labels)

    torch.manual_seed(0)
    arch = dataclasses.replace(VIT_ARCH, d_model=args.embed, n_layers=args.depth, n_heads=args.heads)
    ours = ViT(args.classes, args.image, args.patch, 3, arch)
    torch.manual_seed(0)
    timm_vit = VisionTransformer(img_size=args.image, patch_size=args.patch, embed_dim=args.embed, depth=args.depth,
                                 num_heads=args.heads, num_classes=args.classes)
    contenders = [Contender("ours", ours, training_step(ours, loss)),
                  Contender("timm", timm_vit, training_step(timm_vit, loss))]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 CPU; embed {args.embed}, depth "
          f"{args.depth}, heads {args.heads}, patch {args.patch}, {args.image} px, batch {args.batch}")
    run_rounds(contenders, args.batch, args.steps, args.rounds, args.warmup, "img/s")
    ratios = report(contenders, "img/s")
    print("\n".join(f"{k} = {v:.3f}" for k, v in ratios.items()))
    return ratios


if __name__ == "__main__":
    main()
