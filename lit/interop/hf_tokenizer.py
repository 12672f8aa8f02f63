"""The tokenizer of an exported Hugging Face folder: the model's own ``tokenizer.json`` with a config that names its
special tokens, and the real ids of those tokens in the model's config, so that ``AutoTokenizer.from_pretrained`` and
``generate`` work from the folder alone.

Which tokenizer: the one the checkpoint records (lit/data/tokenizer_record.py), where it still is, or the one
``--tokenizer`` names, which must be that same file (``--force`` writes another, saying so). Shards made here put
``<|endoftext|>`` before every document, so that one token is the model's beginning, end and padding alike, as in
GPT-2's tokenizer.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from lit.data import tokenizer_record
from lit.errors import UserInputError

END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class ExportTokenizer:
    file: Path
    end_of_text: str
    end_of_text_id: int


def choose(trained: dict | None, given: str | None, checkpoint: str, force: bool) -> ExportTokenizer | None:
    """The tokenizer to write beside ``checkpoint``'s weights, or None (said in one warning line) where there is
    none to write."""
    if given is not None:
        path, meta = _tokenizer_file(Path(given))
        tokenizer_record.check(trained, tokenizer_record.of_tokenizer_file(path), checkpoint, force=force,
                               fix="give the tokenizer the model was trained with (or drop --tokenizer to write the "
                                   "one its checkpoint records)")
    elif trained is None or trained.get("kind") != "tokenizers":
        why = ("records no tokenizer (written before checkpoints carried one); give --tokenizer" if trained is None
               else "was trained on characters, which have no Hugging Face tokenizer file")
        sys.stderr.write(f"warning: {checkpoint} {why}: the folder holds the weights without a tokenizer\n")
        return None
    else:
        path, meta = tokenizer_record.recorded_tokenizer_file(trained, checkpoint), {}
    from lit.data.token_bytes import load_tokenizer

    tokenizer = load_tokenizer(path)
    eot = meta.get("eot_id", tokenizer.token_to_id(END_OF_TEXT))
    if eot is None:
        raise UserInputError(f"{path} has no {END_OF_TEXT} token and no meta.json names the end-of-text id; give the "
                             f"shards directory (--tokenizer SHARDS_DIR)")
    return ExportTokenizer(path, tokenizer.id_to_token(int(eot)), int(eot))


def _tokenizer_file(path: Path) -> tuple[Path, dict]:
    if path.is_dir():
        from lit.data.shards import read_meta

        meta = read_meta(path)
        if not meta.get("tokenizer"):
            raise UserInputError(f"{path} has no meta.json naming a tokenizer; give the tokenizers JSON file")
        return Path(meta["tokenizer"]), meta
    if not path.is_file():
        raise UserInputError(f"tokenizer {path} not found; give a tokenizers JSON file or a shards directory")
    return path, {}


def special_token_ids(tokenizer: ExportTokenizer | None) -> dict[str, int | None]:
    """What config.json and generation_config.json say of the special tokens. None, not transformers' defaults
    (Llama's 1 and 2), where the folder has no tokenizer."""
    token_id = tokenizer.end_of_text_id if tokenizer is not None else None
    return {"bos_token_id": token_id, "eos_token_id": token_id, "pad_token_id": token_id}


def write(tokenizer: ExportTokenizer, out: Path, max_length: int) -> None:
    shutil.copyfile(tokenizer.file, out / "tokenizer.json")
    token = tokenizer.end_of_text
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": token, "eos_token": token, "pad_token": token,
        "model_max_length": max_length, "clean_up_tokenization_spaces": False}, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": token, "eos_token": token, "pad_token": token}, indent=2))
