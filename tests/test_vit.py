"""The ViT: equal to timm's VisionTransformer with the baseline plugins; sizes, pooling, positions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from lit.models.timm_vit import state_dict_from_timm
from lit.models.transformer import TransformerStack
from lit.models.vit import VIT_ARCH, ViT, sincos_2d, with_variant


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_baseline_vit_equals_timm(size):
    """Random timm weights (not its init: every tensor perturbed) load through the adapter; logits agree."""
    torch.manual_seed(0)
    d, heads = {"tiny": (48, 3), "small": (64, 4)}[size]
    timm_vit = VisionTransformer(img_size=32, patch_size=4, embed_dim=d, depth=3, num_heads=heads,
                                 num_classes=10).eval()
    with torch.no_grad():
        for p in timm_vit.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = ViT(10, 32, 4, 3, dataclasses.replace(VIT_ARCH, d_model=d, n_layers=3, n_heads=heads)).eval()
    ours.load_state_dict(state_dict_from_timm(timm_vit.state_dict()), strict=True)
    images = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(ours(images), timm_vit(images), rtol=0, atol=1e-5)


def test_adapter_refuses_what_it_cannot_map():
    with pytest.raises(KeyError, match="reg_token"):
        state_dict_from_timm({"reg_token": torch.zeros(1)})


def test_standard_variants_have_the_published_sizes():
    sizes = {}
    for variant in ("tiny", "small", "base"):
        vit = ViT(1000, 224, 16, 3, with_variant(VIT_ARCH, variant))
        sizes[variant] = sum(p.numel() for p in vit.parameters()) / 1e6
    # timm: vit_tiny_patch16_224 5.72M, vit_small 22.05M, vit_base 86.57M.
    assert sizes == pytest.approx({"tiny": 5.72, "small": 22.05, "base": 86.57}, abs=0.01)
    with pytest.raises(ValueError, match="choose one of"):
        with_variant(VIT_ARCH, "huge")


def test_vit_stack_is_bidirectional():
    vit = ViT(3, 16, 4, 3, dataclasses.replace(VIT_ARCH, d_model=32, n_layers=2, n_heads=2)).eval()
    assert isinstance(vit.stack, TransformerStack) and not vit.stack.info.causal
    images = torch.randn(1, 3, 16, 16)
    later = images.clone()
    later[..., 12:, 12:] += 1.0  # the last patch changes: the cls token (position 0) must see it
    assert not torch.allclose(vit(images), vit(later))


def test_mean_pooling_and_sincos_positions():
    arch = dataclasses.replace(VIT_ARCH, d_model=32, n_layers=1, n_heads=2)
    vit = ViT(5, 16, 4, 3, arch, pooling="mean", pos_embed="sincos")
    assert vit.cls_token is None and vit.pos_embed.shape == (1, 16, 32)
    assert "pos_embed" not in vit.state_dict()  # fixed, not learned
    assert vit(torch.randn(2, 3, 16, 16)).shape == (2, 5)
    table = sincos_2d(4, 8)  # position (row 1, col 2) = index 6: [sin, cos](col * w) + [sin, cos](row * w)
    omega = torch.tensor([1.0, 0.01])
    expected = torch.cat([(2 * omega).sin(), (2 * omega).cos(), omega.sin(), omega.cos()])
    torch.testing.assert_close(table[6], expected)


def test_bad_geometry_is_a_clear_error():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ViT(10, 30, 4, 3, VIT_ARCH)
    with pytest.raises(ValueError, match="arch.positions"):
        ViT(10, 32, 4, 3, dataclasses.replace(VIT_ARCH, positions="learned"))


@pytest.mark.parametrize("recipe", ["vit_baseline", "vit_tokenformer", "vit_finetune_deit_s"])
def test_the_deit_recipes_do_not_decay_the_class_token_or_the_positions(recipe):
    # DeiT (timm's create_optimizer with no_weight_decay()), timm, MAE and mmpretrain leave pos_embed and cls_token
    # undecayed; the ViT declares it (arch_plugins.declarations), so the optimizer built from the recipe, with its
    # own options (layer decay in the fine-tuning recipe), has them at 0 and the matrices at the recipe's decay.
    import yaml

    from lit.image_classifier import ImageClassifier
    from lit.models.transformer import TransformerConfig
    from lit.optim import select_optimizer
    from tests.conftest import REPO

    args = yaml.safe_load((REPO / "recipes" / f"{recipe}.yaml").read_text())["model"]["init_args"]
    args.update(arch=TransformerConfig(**{**args["arch"], "d_model": 32, "n_layers": 2, "n_heads": 2}), variant=None,
                init_from=None, image_size=32)
    task = ImageClassifier(**args)
    built = select_optimizer(args.get("optimizer", "adamw"), args.get("optimizer_options")).build(
        task, lr=1e-3, weight_decay=args["weight_decay"], betas=tuple(args["betas"]))
    decay = {id(p): group["weight_decay"] for group in built.param_groups for p in group["params"]}
    named = dict(task.named_parameters())
    assert decay[id(named["model.cls_token"])] == decay[id(named["model.pos_embed"])] == 0.0
    assert args["weight_decay"] > 0
    for name in ("model.patch.weight", "model.head.weight"):
        assert decay[id(named[name])] == pytest.approx(args["weight_decay"])


def test_the_vit_declares_no_decay_only_for_what_it_learns():
    from arch_plugins.declarations import decays

    arch = dataclasses.replace(VIT_ARCH, d_model=32, n_layers=1, n_heads=2)
    learned, fixed = ViT(5, 16, 4, 3, arch), ViT(5, 16, 4, 3, arch, pooling="mean", pos_embed="sincos")
    assert not decays(learned)[id(learned.cls_token)] and not decays(learned)[id(learned.pos_embed)]
    assert decays(learned)[id(learned.patch.weight)]
    assert all(decays(fixed)[id(p)] == (p.dim() >= 2) for p in fixed.parameters())  # no token, no learned table
