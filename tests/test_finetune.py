"""Fine-tuning from published ViT weights: ``--model.init_from`` takes a timm/DeiT file, the model then computes
timm's forward exactly, the head is re-initialised for another class count, and layer-wise lr decay follows timm's
rule."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer
from timm.optim import param_groups_layer_decay

from lit.errors import UserInputError
from lit.image_classifier import ImageClassifier
from lit.models.timm_vit import state_dict_from_timm
from lit.models.vit import VIT_ARCH
from lit.optim import select_optimizer

D, DEPTH, HEADS = 16, 3, 2


def timm_vit(num_classes: int = 5, img_size: int = 32) -> VisionTransformer:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=img_size, patch_size=8, embed_dim=D, depth=DEPTH, num_heads=HEADS,
                            num_classes=num_classes)
    with torch.no_grad():  # not timm's init (zero head, zero biases): every tensor matters
        for p in vit.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return vit.eval()


def ours(init_from, num_classes: int = 5, image_size: int = 32, **kw) -> ImageClassifier:
    arch = dataclasses.replace(VIT_ARCH, d_model=D, n_layers=DEPTH, n_heads=HEADS, norm_options={"eps": 1e-6})
    return ImageClassifier(num_classes=num_classes, image_size=image_size, patch_size=8, arch=arch,
                           init_from=str(init_from), **kw).eval()


@pytest.mark.parametrize("layout", ["deit", "plain", "safetensors"])
def test_a_timm_file_starts_a_model_that_computes_timms_forward(layout, tmp_path):
    reference = timm_vit()
    state = reference.state_dict()
    path = tmp_path / ("vit.safetensors" if layout == "safetensors" else "vit.pth")
    if layout == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save({"model": state} if layout == "deit" else state, path)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(path)(images), reference(images), rtol=0, atol=1e-5)


def test_another_class_count_re_initialises_the_head_and_keeps_the_body(tmp_path):
    reference = timm_vit(num_classes=1000)
    torch.save({"model": reference.state_dict()}, tmp_path / "deit.pth")
    model = ours(tmp_path / "deit.pth", num_classes=3).model
    expected = state_dict_from_timm(reference.state_dict())
    for name, tensor in model.state_dict().items():
        if name.startswith("head."):
            assert tensor.shape[0] == 3
        else:
            assert torch.equal(tensor, expected[name]), name


def test_another_image_size_resamples_the_positions(tmp_path):
    torch.save(timm_vit().state_dict(), tmp_path / "vit.pth")
    model = ours(tmp_path / "vit.pth", image_size=48).model  # 4x4 patches become 6x6
    assert model.pos_embed.shape == (1, 1 + 36, D)


def test_files_that_are_not_this_vit_are_one_clear_error(tmp_path):
    torch.save(timm_vit().state_dict(), tmp_path / "vit.pth")
    with pytest.raises(UserInputError, match="does not have this model's shape"):
        arch = dataclasses.replace(VIT_ARCH, d_model=2 * D, n_layers=DEPTH, n_heads=HEADS)
        ImageClassifier(num_classes=5, image_size=32, patch_size=8, arch=arch, init_from=str(tmp_path / "vit.pth"))
    registers = VisionTransformer(img_size=32, patch_size=8, embed_dim=D, depth=DEPTH, num_heads=HEADS,
                                  reg_tokens=4, num_classes=5)
    torch.save(registers.state_dict(), tmp_path / "registers.pth")
    with pytest.raises(UserInputError, match="reg_token"):
        ours(tmp_path / "registers.pth")


def test_layer_decay_gives_every_parameter_timms_learning_rate_scale(tmp_path):
    reference = timm_vit()
    torch.save(reference.state_dict(), tmp_path / "vit.pth")
    module = ours(tmp_path / "vit.pth", layer_decay=0.75)
    optimizer = select_optimizer("adamw", None).build(module, lr=1.0, weight_decay=0.05, betas=(0.9, 0.999))
    lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    by_name = dict(module.model.named_parameters())
    timm_names = dict(reference.named_parameters())
    renamed = state_dict_from_timm({n: torch.tensor(i) for i, n in enumerate(timm_names)})
    timm_scale = {}
    for group in param_groups_layer_decay(reference, weight_decay=0.05, layer_decay=0.75):
        for p in group["params"]:
            timm_scale[id(p)] = group["lr_scale"]
    checked = 0
    for ours_name, index in renamed.items():
        timm_param = list(timm_names.values())[int(index)]
        assert lr_of[id(by_name[ours_name])] == pytest.approx(timm_scale[id(timm_param)]), ours_name
        checked += 1
    assert checked == len(timm_names) and min(lr_of.values()) == pytest.approx(0.75 ** (DEPTH + 1))
