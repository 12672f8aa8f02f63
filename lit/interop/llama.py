"""Export the baseline family (pre-RMSNorm, plain residual, SwiGLU, RoPE, no biases) to a Hugging Face
``LlamaForCausalLM`` folder: ``config.json`` + ``model.safetensors``, which ``from_pretrained``, lm-eval's ``hf``
backend and vLLM load.

    python cli.py export-hf runs/.../last.ckpt --out exported/

The mapping: the fused q|k|v splits into q/k/v_proj; the SwiGLU's fused input is value|gate, so its first half
is ``up_proj`` and its second ``gate_proj`` (Llama computes down(silu(gate) * up)); RoPE rotates halves, as
Llama's does. Any other component (a plugin variant) has no Llama equivalent and is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

BASELINE = {"norm": "rmsnorm", "residual": "add", "projection": "linear", "mlp": "swiglu", "positions": "rope",
            "rope_pct": 1.0, "bias": False, "parametrization": "sp", "qk_norm": None, "logit_softcap": None,
            "clipped_softmax_gamma": None, "gated_attention": False}


def llama_config(module) -> dict:
    hp, arch = module.hparams, module.hparams.arch
    different = {k: getattr(arch, k) for k, v in BASELINE.items() if getattr(arch, k) != v}
    if different:
        shown = ", ".join(f"{k}={v!r}" for k, v in different.items())
        raise UserInputError(f"export-hf writes the baseline family (rmsnorm, add, linear, swiglu, rope); this model "
                             f"has {shown}, which LlamaForCausalLM cannot express")
    unknown = set(arch.norm_options) - {"eps"}
    if unknown or arch.residual_options or arch.projection_options:
        raise UserInputError(f"export-hf: component options {sorted(unknown) or ''} {arch.residual_options or ''} "
                             f"{arch.projection_options or ''} have no LlamaForCausalLM equivalent")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": hp.vocab_size,
            "hidden_size": arch.d_model, "intermediate_size": arch.resolved_mlp_hidden(),
            "num_hidden_layers": arch.n_layers, "num_attention_heads": arch.n_heads,
            "num_key_value_heads": arch.n_heads, "head_dim": arch.d_model // arch.n_heads,
            "max_position_embeddings": hp.block_size, "rms_norm_eps": arch.norm_options.get("eps", 1e-6),
            "rope_theta": arch.rope_base, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": bool(hp.tie_embeddings), "torch_dtype": "float32"}


def llama_state_dict(ours: dict[str, torch.Tensor], n_layers: int, d: int) -> dict[str, torch.Tensor]:
    hf = {"model.embed_tokens.weight": ours["tok.weight"], "model.norm.weight": ours["stack.final.weight"],
          "lm_head.weight": ours["head.weight"]}
    for i in range(n_layers):
        b, to = f"stack.blocks.{i}.", f"model.layers.{i}."
        q, k, v = ours[b + "attn.qkv.weight"].split(d, dim=0)
        value, gate = ours[b + "mlp.up.weight"].chunk(2, dim=0)
        hf.update({to + "input_layernorm.weight": ours[b + "attn_in.weight"],
                   to + "self_attn.q_proj.weight": q, to + "self_attn.k_proj.weight": k,
                   to + "self_attn.v_proj.weight": v, to + "self_attn.o_proj.weight": ours[b + "attn.out.weight"],
                   to + "post_attention_layernorm.weight": ours[b + "mlp_in.weight"],
                   to + "mlp.up_proj.weight": value, to + "mlp.gate_proj.weight": gate,
                   to + "mlp.down_proj.weight": ours[b + "mlp.down.weight"]})
    return {k: v.detach().contiguous().clone() for k, v in hf.items()}


def export_llama(module, out: str | Path) -> Path:
    from safetensors.torch import save_file

    config = llama_config(module)
    state = llama_state_dict(module.model.state_dict(), config["num_hidden_layers"], config["hidden_size"])
    if config["tie_word_embeddings"]:
        state.pop("lm_head.weight")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@one_line_errors
def main(argv: list[str]) -> int:
    from lit.procedures.checkpoint_io import read_trained_lm

    p = OneLineArgumentParser(prog="cli.py export-hf", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a LanguageModel checkpoint (.ckpt) of the baseline family")
    p.add_argument("--out", required=True, help="the folder to write config.json and model.safetensors into")
    a = p.parse_args(argv)
    module = read_trained_lm(a.checkpoint, "export-hf").load()
    llama_config(module)  # refuse before writing anything
    export_llama(module, a.out)
    print(f"wrote {a.out}: LlamaForCausalLM config.json and model.safetensors")
    return 0
