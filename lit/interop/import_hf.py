"""``cli.py import-hf``: a local Hugging Face folder (``config.json`` + safetensors, as ``save_pretrained`` writes it)
as a LanguageModel checkpoint that ``validate``, ``fit --model.init_from``, ``predict``, ``lm-eval`` and the
procedures read. The config's ``model_type`` picks the converter: ``gpt2`` (lit/interop/gpt2.py) or ``llama``
(lit/interop/llama.py). Nothing is downloaded, and ``transformers`` is not needed (only ``safetensors``).

    python cli.py import-hf path/to/gpt2 --out gpt2.ckpt
    python cli.py import-hf path/to/llama --out llama.ckpt
"""

from __future__ import annotations

import json
from pathlib import Path

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.interop.checkpoint import write_checkpoint


def read_config(folder: Path) -> dict:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UserInputError(f"{folder} has no config.json; save the model there with save_pretrained")
    return json.loads(config_file.read_text())


def import_folder(folder: str | Path):
    """A LanguageModel holding the Hugging Face checkpoint in ``folder``, by its ``model_type``."""
    from lit.interop.gpt2 import import_gpt2
    from lit.interop.llama import import_llama

    folder = Path(folder)
    model_type = read_config(folder).get("model_type")
    importers = {"gpt2": import_gpt2, "llama": import_llama}
    if model_type not in importers:
        raise UserInputError(f"{folder} holds a {model_type!r} model; import-hf reads {' and '.join(importers)} "
                             f"checkpoints (GPT2LMHeadModel, LlamaForCausalLM)")
    return importers[model_type](folder)


@one_line_errors
def main(argv: list[str]) -> int:
    p = OneLineArgumentParser(prog="cli.py import-hf", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a local folder with config.json and safetensors weights (GPT-2 or Llama)")
    p.add_argument("--out", required=True, help="the checkpoint to write (.ckpt)")
    a = p.parse_args(argv)
    module = import_folder(a.folder)
    write_checkpoint(module, a.out)
    arch = module.hparams.arch
    print(f"wrote {a.out}: {read_config(Path(a.folder))['model_type']} with {arch.n_layers} layers, d_model "
          f"{arch.d_model}, vocabulary {module.hparams.vocab_size}, context {module.hparams.block_size}")
    return 0
