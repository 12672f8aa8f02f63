"""Hugging Face interop: a GPT-2 made here with ``transformers`` (random weights, perturbed LayerNorms), saved with
``save_pretrained`` and imported, gives the same logits. Nothing is downloaded."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     activation_function="gelu_new")
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name:  # ones and zeros at init would hide a swapped weight and bias
                p.add_(0.2 * torch.randn_like(p))
            if "c_fc" in name:  # pre-activations of order 1, where the two GELUs part (init's are tiny)
                p.mul_(20)
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return folder, model


def test_imported_gpt2_gives_the_same_logits(gpt2_folder, tmp_path):
    from lit.commands import main
    from lit.procedures.checkpoint_io import read_trained_lm

    folder, reference = gpt2_folder
    main(["import-hf", str(folder), "--out", str(tmp_path / "gpt2.ckpt")])
    module = read_trained_lm(tmp_path / "gpt2.ckpt", "test").load().eval()
    idx = torch.randint(0, 97, (3, 32))
    with torch.no_grad():
        theirs = reference(idx).logits
        ours = module(idx)
    assert (ours - theirs).abs().max().item() < 1e-5
    # The tanh GELU is what makes it match: the exact GELU is measurably off.
    exact = module.hparams.arch
    exact.mlp = "gelu"
    from lit.language_model import LanguageModel

    other = LanguageModel(vocab_size=97, block_size=32, arch=exact, tie_embeddings=True).eval()
    other.load_state_dict(module.state_dict())
    with torch.no_grad():
        assert (other(idx) - theirs).abs().max().item() > 1e-4


def test_import_refuses_what_it_cannot_express(gpt2_folder, tmp_path, capsys):
    from lit.commands import main

    folder, _ = gpt2_folder
    odd = tmp_path / "odd"
    odd.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    (odd / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        main(["import-hf", str(odd), "--out", str(tmp_path / "x.ckpt")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "activation 'relu'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.ckpt").exists()


def baseline_checkpoint(tmp_path, **arch):
    from lit.interop.checkpoint import write_checkpoint
    from lit.language_model import LanguageModel
    from lit.models.transformer import TransformerConfig

    torch.manual_seed(1)
    module = LanguageModel(vocab_size=101, block_size=32,
                           arch=TransformerConfig(d_model=32, n_layers=2, n_heads=4, **arch)).eval()
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:  # gains drawn around 1: a swapped or missing norm would show
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return write_checkpoint(module, tmp_path / "base.ckpt"), module


def test_exported_baseline_round_trips_through_llama(tmp_path):
    from lit.commands import main

    path, module = baseline_checkpoint(tmp_path)
    main(["export-hf", str(path), "--out", str(tmp_path / "llama")])
    llama = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama").eval()
    idx = torch.randint(0, 101, (2, 32))
    with torch.no_grad():
        assert (llama(idx).logits - module(idx)).abs().max().item() < 1e-5


def test_export_refuses_a_plugin_variant(tmp_path, capsys):
    from lit.commands import main

    path, _ = baseline_checkpoint(tmp_path, norm="layernorm")
    with pytest.raises(SystemExit) as exit_info:
        main(["export-hf", str(path), "--out", str(tmp_path / "llama")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "norm='layernorm'" in err and not (tmp_path / "llama").exists()


def llama_folder(tmp_path, name="llama", shard_size=None, **overrides):
    """A tiny LlamaForCausalLM made here (random weights, norm gains drawn around 1), saved with save_pretrained
    (in shards of ``shard_size`` with their index, if given)."""
    torch.manual_seed(2)
    settings = dict(vocab_size=89, hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, max_position_embeddings=24, rope_theta=5000.0, rms_norm_eps=1e-5)
    config = transformers.LlamaConfig(**{**settings, **overrides})
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # gains (and biases) away from 1 and 0: a swapped or missing one would show
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / name, **({"max_shard_size": shard_size} if shard_size else {}))
    return tmp_path / name, model


@pytest.mark.parametrize("variant", [{}, {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}],
                         ids=["untied_sharded", "tied_biases"])
def test_imported_llama_gives_the_same_logits(tmp_path, variant):
    from lit.commands import main
    from lit.procedures.checkpoint_io import read_trained_lm

    folder, reference = llama_folder(tmp_path, shard_size=None if variant else "20KB", **variant)
    assert (folder / "model.safetensors.index.json").is_file() == (not variant)
    main(["import-hf", str(folder), "--out", str(tmp_path / "llama.ckpt")])
    module = read_trained_lm(tmp_path / "llama.ckpt", "test").load().eval()
    arch = module.hparams.arch
    assert (arch.rope_base, arch.norm_options["eps"], arch.bias) == (5000.0, 1e-5, bool(variant))
    assert (module.model.head.weight is module.model.tok.weight) == bool(variant)
    idx = torch.randint(0, 89, (2, 24))
    with torch.no_grad():
        assert (module(idx) - reference(idx).logits).abs().max().item() < 1e-5


def test_llama_export_then_import_round_trips(tmp_path):
    from lit.interop.llama import export_llama, import_llama

    _, module = baseline_checkpoint(tmp_path, rope_base=500.0)
    back = import_llama(export_llama(module, tmp_path / "llama")).eval()
    assert back.hparams.arch.rope_base == 500.0
    idx = torch.randint(0, 101, (2, 32))
    with torch.no_grad():
        assert (back(idx) - module(idx)).abs().max().item() < 1e-5


@pytest.mark.parametrize("field,value", [("num_key_value_heads", 2), ("rope_scaling", {"rope_type": "linear",
                                                                                        "factor": 2.0})])
def test_llama_import_refuses_what_the_stack_cannot_express(tmp_path, capsys, field, value):
    from lit.commands import main

    folder = tmp_path / "odd"
    folder.mkdir()
    config = {"model_type": "llama", "vocab_size": 89, "hidden_size": 32, "intermediate_size": 72,
              "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 24, field: value}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["import-hf", str(folder), "--out", str(tmp_path / "x.ckpt")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert field in err and not (tmp_path / "x.ckpt").exists()
