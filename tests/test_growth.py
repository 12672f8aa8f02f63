"""TokenFormer growth: a checkpoint with fewer parameter tokens loads into a larger model.

With zero new keys and the old scale kept, the grown model computes exactly the same function (the
loss before and after growth is equal); the other options behave as documented; bad checkpoints
give one clear line. Real Lightning checkpoints, for both tasks, and through the CLI.
"""

from __future__ import annotations

import dataclasses

import lightning as L
import pytest
import torch

from arch_plugins.growth import GrowthError, load_grown
from arch_plugins.projections.pattention import Pattention
from lit.cli import main
from lit.errors import UserInputError
from lit.image_classifier import ImageClassifier
from lit.init_from import Growth
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig
from lit.models.vit import VIT_ARCH
from tests.conftest import REPO, TINY_LM


def _tokenformer(tokens: int, **arch) -> TransformerConfig:
    opts = {"tokens_qkv": tokens, "tokens_out": tokens, "tokens_ffn": 4 * tokens}
    base = dict(d_model=16, n_layers=2, n_heads=2, norm="layernorm_nonparam", projection="pattention",
                projection_options=opts)
    return TransformerConfig(**{**base, **arch})


def _save(module: L.LightningModule, path) -> str:
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(path)
    return str(path)


def _trained_small_lm(tmp_path) -> tuple[LanguageModel, str]:
    torch.manual_seed(0)
    small = LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(4), tie_embeddings=True)
    with torch.no_grad():  # "trained": keys and values far from their init, so growth is a real test
        for p in small.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return small, _save(small, tmp_path / "small.ckpt")


def _lm_loss(model: LanguageModel) -> torch.Tensor:
    idx = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(1))
    return model._loss(model(idx[:, :-1]), idx[:, 1:])


def test_grown_language_model_computes_the_same_function(tmp_path):
    small, ckpt = _trained_small_lm(tmp_path)
    big = LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8), tie_embeddings=True, init_from=ckpt)
    attn_q = big.model.stack.blocks[0].attn.qkv.parts[0]
    assert attn_q.num_tokens == 8 and attn_q.scale_tokens.item() == 4
    assert big.model.stack.blocks[1].mlp.num_tokens == 32
    torch.testing.assert_close(big.model.stack.blocks[0].mlp.key_param_tokens[:16],
                               small.model.stack.blocks[0].mlp.key_param_tokens, rtol=0, atol=0)
    assert big.model.stack.blocks[0].mlp.key_param_tokens[16:].abs().sum() == 0
    torch.testing.assert_close(_lm_loss(big), _lm_loss(small), rtol=0, atol=1e-6)


def test_reference_style_growth_changes_the_function(tmp_path):
    small, ckpt = _trained_small_lm(tmp_path)
    for growth in (Growth(new_keys="zero", preserve_function=False), Growth(new_keys="init", preserve_function=False)):
        big = LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8), tie_embeddings=True,
                            init_from=ckpt, growth=growth)
        assert big.model.stack.blocks[0].mlp.scale_tokens.item() == 32  # sqrt(n_new)
        assert (_lm_loss(big) - _lm_loss(small)).abs() > 1e-4
    with pytest.raises(UserInputError, match="preserve_function needs new_keys='zero'"):
        LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8), tie_embeddings=True, init_from=ckpt,
                      growth=Growth(new_keys="init", preserve_function=True))


def test_a_grown_checkpoint_keeps_its_scale_when_resumed_or_grown_again(tmp_path):
    _, ckpt = _trained_small_lm(tmp_path)
    big = LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8), tie_embeddings=True, init_from=ckpt)
    ckpt2 = _save(big, tmp_path / "big.ckpt")
    bigger = LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(12), tie_embeddings=True, init_from=ckpt2)
    assert bigger.model.stack.blocks[0].mlp.scale_tokens.item() == 16  # still the first model's n
    torch.testing.assert_close(_lm_loss(bigger), _lm_loss(big), rtol=0, atol=1e-6)


def test_grown_vit_computes_the_same_function(tmp_path):
    torch.manual_seed(0)
    arch = dataclasses.replace(VIT_ARCH, d_model=16, n_layers=2, n_heads=2, bias=False, norm="layernorm_nonparam",
                               norm_options={}, projection="pattention")
    small = ImageClassifier(5, 8, 1, dataclasses.replace(arch, projection_options={"tokens_qkv": 6}), patch_size=2)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ckpt = _save(small, tmp_path / "vit.ckpt")
    big = ImageClassifier(5, 8, 1, dataclasses.replace(arch, projection_options={"tokens_qkv": 12}), patch_size=2,
                          init_from=ckpt)
    images = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(big(images), small(images), rtol=0, atol=1e-5)


def test_growth_refuses_what_is_not_growth(tmp_path):
    _, ckpt = _trained_small_lm(tmp_path)
    with pytest.raises(UserInputError, match="cannot grow from 4 to 2"):  # shrinking
        LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(2), tie_embeddings=True, init_from=ckpt)
    with pytest.raises(UserInputError, match="only modules that implement grow_from can grow"):  # another vocabulary
        LanguageModel(vocab_size=12, block_size=8, arch=_tokenformer(8), tie_embeddings=True, init_from=ckpt)
    with pytest.raises(UserInputError, match="not a smaller version"):  # another depth
        LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8, n_layers=3), tie_embeddings=True,
                      init_from=ckpt)
    with pytest.raises(UserInputError, match="not found"):
        LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8), init_from=str(tmp_path / "nope.ckpt"))
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserInputError, match="cannot read"):
        LanguageModel(vocab_size=11, block_size=8, arch=_tokenformer(8), init_from=str(tmp_path / "bad.ckpt"))


def test_load_grown_is_plain_loading_for_models_without_tokens():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    assert load_grown(b, a.state_dict()) == []
    assert torch.equal(a.weight, b.weight)
    with pytest.raises(GrowthError):
        load_grown(Pattention(3, 3, 4), {"value_param_tokens": torch.zeros(2, 3)})


@pytest.mark.slow  # two CLI fits (~40 s); the growth itself is tested in-process above, LM and ViT
def test_grow_from_the_command_line(workdir):
    small = ["--config", str(REPO / "recipes/gpt_tokenformer.yaml"), *TINY_LM, "--trainer.max_steps=2",
             "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1"]
    cli = main(["fit", *small])
    ckpt = cli.trainer.checkpoint_callback.last_model_path
    grown = main(["fit", "--config", str(REPO / "recipes/gpt_tokenformer_grow.yaml"), *TINY_LM,
                  "--trainer.max_steps=1", "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1",
                  f"--model.init_from={ckpt}"])
    ffn = grown.model.model.stack.blocks[0].mlp
    assert ffn.num_tokens == 1024 and ffn.scale_tokens.item() == 512
    assert grown.trainer.global_step == 1  # a fresh run: the step (and optimizer) did not come from the checkpoint
