"""Import a Hugging Face GPT-2 checkpoint (``GPT2LMHeadModel``: ``config.json`` + ``model.safetensors`` in a local
folder) as a LanguageModel checkpoint that ``validate``, ``fit --model.init_from`` and the procedures read
(``cli.py import-hf``, lit/interop/import_hf.py).

    python cli.py import-hf path/to/gpt2 --out gpt2.ckpt

GPT-2 is our stack with pre-LayerNorm (with bias), learned positions, biases everywhere, a tanh-approximate GELU
MLP (``mlp: gelu_tanh``, GPT-2's ``gelu_new``) and the head tied to the token embedding; its Conv1D weights are
stored transposed. The logits are those of ``transformers`` (tests/test_interop.py). Nothing is downloaded, and
``transformers`` is not needed to import (only ``safetensors``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lit.errors import UserInputError

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def gpt2_architecture(config: dict):
    """(vocab_size, block_size, TransformerConfig) of a GPT-2 ``config.json``; refuses what the stack cannot be."""
    from lit.models.transformer import TransformerConfig

    activation = config.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise UserInputError(f"GPT-2 activation {activation!r} has no equivalent here; supported: "
                             f"{', '.join(ACTIVATIONS)}")
    for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if config.get(flag):
            raise UserInputError(f"this GPT-2 checkpoint sets {flag}, which the stack does not express")
    if config.get("scale_attn_weights") is False:
        raise UserInputError("this GPT-2 checkpoint sets scale_attn_weights: false, which the stack does not express")
    d = config["n_embd"]
    arch = TransformerConfig(d_model=d, n_layers=config["n_layer"], n_heads=config["n_head"],
                             mlp=ACTIVATIONS[activation], mlp_hidden=config.get("n_inner") or 4 * d, bias=True,
                             positions="learned", norm="layernorm",
                             norm_options={"eps": config.get("layer_norm_epsilon", 1e-5)})
    return config["vocab_size"], config["n_positions"], arch


def gpt2_state_dict(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Our GPT's state dict from a GPT2LMHeadModel's (``transformer.`` prefix optional)."""
    hf = {k.removeprefix("transformer."): v for k, v in hf.items()}
    ours = {"tok.weight": hf["wte.weight"], "pos.weight": hf["wpe.weight"], "head.weight": hf["wte.weight"],
            "stack.final.weight": hf["ln_f.weight"], "stack.final.bias": hf["ln_f.bias"]}
    names = {"ln_1": "attn_in", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out", "ln_2": "mlp_in",
             "mlp.c_fc": "mlp.up", "mlp.c_proj": "mlp.down"}
    for i in range(n_layers):
        for theirs, mine in names.items():
            weight = hf[f"h.{i}.{theirs}.weight"]
            ours[f"stack.blocks.{i}.{mine}.weight"] = weight if theirs.startswith("ln") else weight.t().contiguous()
            ours[f"stack.blocks.{i}.{mine}.bias"] = hf[f"h.{i}.{theirs}.bias"]
    return ours


def import_gpt2(folder: str | Path):
    """A LanguageModel holding the GPT-2 checkpoint in ``folder``."""
    from safetensors.torch import load_file

    from lit.language_model import LanguageModel

    folder = Path(folder)
    config_file, weights = folder / "config.json", folder / "model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise UserInputError(f"{folder} has no config.json and model.safetensors; save the model there with "
                             f"save_pretrained (safetensors)")
    config = json.loads(config_file.read_text())
    if config.get("model_type") != "gpt2":
        raise UserInputError(f"{folder} holds a {config.get('model_type')!r} model; import-hf reads GPT-2 checkpoints")
    vocab, block, arch = gpt2_architecture(config)
    module = LanguageModel(vocab_size=vocab, block_size=block, arch=arch, tie_embeddings=True)
    module.model.load_state_dict(gpt2_state_dict(load_file(weights), arch.n_layers), strict=True)
    return module
