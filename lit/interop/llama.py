"""The baseline family (pre-RMSNorm, plain residual, SwiGLU, RoPE) and Hugging Face's ``LlamaForCausalLM``, both ways.

Export writes a ``config.json`` + ``model.safetensors`` folder with the model's tokenizer (``tokenizer.json`` and its
config, lit/interop/hf_tokenizer.py), which ``from_pretrained``, ``AutoTokenizer``, lm-eval's ``hf`` backend and vLLM
load; import reads such a folder (one ``model.safetensors`` or shards with their index) as a LanguageModel
checkpoint::

    python cli.py export-hf runs/.../last.ckpt --out exported/
    python cli.py import-hf path/to/llama --out llama.ckpt

The mapping: the fused q|k|v splits into q/k/v_proj; the SwiGLU's fused input is value|gate, so its first half
is ``up_proj`` and its second ``gate_proj`` (Llama computes down(silu(gate) * up)); RoPE rotates halves, as
Llama's does, with the config's theta. Any other component (a plugin variant) has no Llama equivalent and export
refuses it in one line; import refuses, naming the field, what the stack cannot express: grouped-query attention
(fewer key/value heads than query heads), RoPE scaling (Llama 3.1's, YaRN, ...), a head width other than
d_model / n_heads, an activation other than SiLU, biases on attention but not the MLP or the other way round.
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


def export_llama(module, out: str | Path, tokenizer=None) -> Path:
    """Write ``module`` as a Llama folder, with ``tokenizer`` (lit/interop/hf_tokenizer.py) and its special ids
    where given."""
    from safetensors.torch import save_file

    from lit.interop import hf_tokenizer

    config = {**llama_config(module), **hf_tokenizer.special_token_ids(tokenizer)}
    state = llama_state_dict(module.model.state_dict(), config["num_hidden_layers"], config["hidden_size"])
    if config["tie_word_embeddings"]:
        state.pop("lm_head.weight")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    ids = hf_tokenizer.special_token_ids(tokenizer)
    (out / "generation_config.json").write_text(json.dumps({**ids, "_from_model_config": True}, indent=2))
    if tokenizer is not None:
        hf_tokenizer.write(tokenizer, out, config["max_position_embeddings"])
    return out


def _rope_theta(config: dict) -> float:
    """The config's RoPE base, refusing a scaled RoPE (transformers 5 writes ``rope_parameters``, 4 ``rope_theta``
    and ``rope_scaling``)."""
    parameters = config.get("rope_parameters") or {}
    kind = parameters.get("rope_type", "default")
    if kind != "default":
        raise UserInputError(f"this Llama checkpoint sets rope_parameters.rope_type={kind!r}; the stack's RoPE is the "
                             f"unscaled one (rope_type 'default'), so import-hf cannot express it")
    if config.get("rope_scaling"):
        raise UserInputError(f"this Llama checkpoint sets rope_scaling={config['rope_scaling']!r}; the stack's RoPE is "
                             f"the unscaled one, so import-hf cannot express it")
    return float(parameters.get("rope_theta", config.get("rope_theta", 10000.0)))


def llama_architecture(config: dict):
    """(vocab_size, block_size, TransformerConfig, tied head) of a Llama ``config.json``; refuses, naming the field,
    what the stack cannot express."""
    from lit.models.transformer import TransformerConfig

    d, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if kv_heads != heads:
        raise UserInputError(f"this Llama checkpoint sets num_key_value_heads={kv_heads} with num_attention_heads="
                             f"{heads} (grouped-query attention); the stack has one key/value head per query head, "
                             f"so import-hf cannot express it")
    head_dim = config.get("head_dim") or d // heads
    if head_dim * heads != d:
        raise UserInputError(f"this Llama checkpoint sets head_dim={head_dim} with hidden_size={d} and {heads} heads; "
                             f"the stack's heads split d_model evenly (head_dim = hidden_size / num_attention_heads)")
    if config.get("hidden_act", "silu") != "silu":
        raise UserInputError(f"this Llama checkpoint sets hidden_act={config['hidden_act']!r}; the stack's SwiGLU "
                             f"uses silu")
    attention_bias, mlp_bias = bool(config.get("attention_bias")), bool(config.get("mlp_bias"))
    if attention_bias != mlp_bias:
        raise UserInputError(f"this Llama checkpoint sets attention_bias={attention_bias} and mlp_bias={mlp_bias}; "
                             f"the stack's bias switch covers attention and MLP alike")
    arch = TransformerConfig(d_model=d, n_layers=config["num_hidden_layers"], n_heads=heads, mlp="swiglu",
                             mlp_hidden=config["intermediate_size"], bias=attention_bias, positions="rope",
                             rope_base=_rope_theta(config), norm="rmsnorm",
                             norm_options={"eps": config.get("rms_norm_eps", 1e-6)})
    return config["vocab_size"], config["max_position_embeddings"], arch, bool(config.get("tie_word_embeddings"))


def our_state_dict(hf: dict[str, torch.Tensor], n_layers: int, *, tied: bool,
                   bias: bool) -> dict[str, torch.Tensor]:
    """Our GPT's state dict from a LlamaForCausalLM's; refuses a missing weight or one with no place here."""
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}  # derived, not a weight
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in hf:
            raise UserInputError(f"the Llama checkpoint has no {key}; is it a complete LlamaForCausalLM save?")
        used.add(key)
        return hf[key]

    embed = take("model.embed_tokens.weight")
    ours = {"tok.weight": embed, "stack.final.weight": take("model.norm.weight"),
            "head.weight": embed if tied else take("lm_head.weight")}
    if tied:
        used.add("lm_head.weight")  # a save may keep the tied copy
    params = ("weight", "bias") if bias else ("weight",)
    for i in range(n_layers):
        b, frm = f"stack.blocks.{i}.", f"model.layers.{i}."
        ours[b + "attn_in.weight"] = take(frm + "input_layernorm.weight")
        ours[b + "mlp_in.weight"] = take(frm + "post_attention_layernorm.weight")
        for p in params:
            ours[b + f"attn.qkv.{p}"] = torch.cat([take(frm + f"self_attn.{x}_proj.{p}") for x in "qkv"])
            ours[b + f"attn.out.{p}"] = take(frm + f"self_attn.o_proj.{p}")
            ours[b + f"mlp.up.{p}"] = torch.cat([take(frm + f"mlp.up_proj.{p}"), take(frm + f"mlp.gate_proj.{p}")])
            ours[b + f"mlp.down.{p}"] = take(frm + f"mlp.down_proj.{p}")
    left = sorted(set(hf) - used)
    if left:
        raise UserInputError(f"the Llama checkpoint has weights the stack has no place for: {', '.join(left[:4])}"
                             f"{' ...' if len(left) > 4 else ''}")
    return ours


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``save_pretrained`` folder: ``model.safetensors``, or the shards its index names."""
    from safetensors.torch import load_file

    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            tensors.update(load_file(folder / shard))
        return tensors
    raise UserInputError(f"{folder} has no model.safetensors (or model.safetensors.index.json and its shards); save "
                         f"the model there with save_pretrained (safetensors)")


def import_llama(folder: str | Path, config: dict | None = None):
    """A LanguageModel holding the LlamaForCausalLM checkpoint in ``folder``."""
    from lit.language_model import LanguageModel

    folder = Path(folder)
    config = config if config is not None else json.loads((folder / "config.json").read_text())
    vocab, block, arch, tied = llama_architecture(config)
    hf = read_safetensors(folder)
    state = our_state_dict(hf, arch.n_layers, tied=tied, bias=arch.bias)
    module = LanguageModel(vocab_size=vocab, block_size=block, arch=arch, tie_embeddings=tied)
    module.model.load_state_dict(state, strict=True)
    return module


@one_line_errors
def main(argv: list[str]) -> int:
    from lit.procedures.checkpoint_io import read_trained_lm

    p = OneLineArgumentParser(prog="cli.py export-hf", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a LanguageModel checkpoint (.ckpt) of the baseline family")
    p.add_argument("--out", required=True, help="the folder to write config.json and model.safetensors into")
    p.add_argument("--tokenizer", default=None,
                   help="the tokenizers JSON (or shards directory) to write beside the weights (default: the one the "
                        "checkpoint records, where it was at training)")
    p.add_argument("--force", action="store_true",
                   help="write a tokenizer other than the one the checkpoint records (refused otherwise)")
    a = p.parse_args(argv)
    from lit.data import tokenizer_record
    from lit.interop import hf_tokenizer

    trained = read_trained_lm(a.checkpoint, "export-hf")
    module = trained.load()
    llama_config(module)  # refuse before writing anything
    tokenizer = hf_tokenizer.choose(tokenizer_record.in_checkpoint(trained.checkpoint), a.tokenizer, a.checkpoint,
                                    a.force)
    export_llama(module, a.out, tokenizer)
    written = "config.json, model.safetensors" + (", tokenizer.json and its config" if tokenizer else "")
    print(f"wrote {a.out}: LlamaForCausalLM {written}")
    return 0
