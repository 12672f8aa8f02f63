"""The text <-> token ids mapping a trained checkpoint is read with: the tokenizer its checkpoint records
(lit/data/tokenizer_record.py, where that file still is), or one the user names: a tokenizers JSON file, a shards
directory (its ``meta.json`` names the tokenizer ``prepare-data`` used), or the recipe the model was trained with
(its data section: shards, a text file or the embedded corpus for a char-level model). Whichever it is, it must be
the one the checkpoint records (``--force`` goes on, saying so)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from lit.data import tokenizer_record
from lit.errors import UserInputError

END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class TextCodec:
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    vocab_size: int
    prefix_id: int  # the token a document starts after: EOT/BOS for BPE shards, a newline for characters
    description: str
    exact_vocabulary: bool  # a char vocabulary must be the checkpoint's exactly; BPE models may pad theirs
    record: dict  # which tokenizer this is (lit/data/tokenizer_record.py), checked against the checkpoint's


def char_codec(text: str, source: str) -> TextCodec:
    from lit.data.text import CharTokenizer

    tokenizer = CharTokenizer(text)
    if "\n" not in tokenizer.index:
        raise UserInputError(f"{source} has no newline, the token a char-level document starts after")
    return TextCodec(tokenizer.encode, tokenizer.decode, tokenizer.vocab_size, tokenizer.index["\n"],
                     f"characters of {source}", exact_vocabulary=True,
                     record=tokenizer_record.of_characters(tokenizer.chars, source))


def bpe_codec(tokenizer_file: str | Path, meta: dict | None = None) -> TextCodec:
    from lit.data.token_bytes import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_file)
    meta = meta or {}
    starts = [meta[k] for k in ("bos_id", "eot_id") if meta.get(k) is not None]
    prefix = starts[0] if starts else tokenizer.token_to_id(END_OF_TEXT)
    if prefix is None:
        raise UserInputError(f"{tokenizer_file} has no {END_OF_TEXT} token and no meta.json names a document-start "
                             f"token; give the shards directory (--tokenizer SHARDS_DIR) whose meta.json does")
    return TextCodec(lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                     lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
                     tokenizer.get_vocab_size(), int(prefix), f"tokenizer {tokenizer_file}", exact_vocabulary=False,
                     record=tokenizer_record.of_tokenizer_file(tokenizer_file))


def codec_from_path(path: str | Path) -> TextCodec:
    """A tokenizers JSON file, or a shards directory whose meta.json names one."""
    from lit.data.shards import read_meta

    path = Path(path)
    if path.is_dir():
        meta = read_meta(path)
        if not meta.get("tokenizer"):
            raise UserInputError(f"{path} has no meta.json naming a tokenizer; give the tokenizers JSON file "
                                 f"(--tokenizer tokenizer.json)")
        return bpe_codec(meta["tokenizer"], meta)
    return bpe_codec(path)


def codec_from_recipe(recipe_file: str | Path) -> TextCodec:
    import yaml

    from lit.data.text import EMBEDDED_CORPUS

    recipe_file = Path(recipe_file)
    if not recipe_file.is_file():
        raise UserInputError(f"recipe not found: {recipe_file} (give the YAML the checkpoint was trained with)")
    recipe = yaml.safe_load(recipe_file.read_text()) or {}
    data = recipe.get("data") if isinstance(recipe, dict) else None
    args = dict((data or {}).get("init_args") or {}) if isinstance(data, dict) else {}
    if not str((data or {}).get("class_path", "")).endswith("TextDataModule"):
        raise UserInputError(f"{recipe_file} has no language-model data section (lit.data.TextDataModule); give "
                             f"--tokenizer instead")
    if args.get("shards_dir"):
        if args.get("tokenizer"):
            from lit.data.shards import read_meta

            return bpe_codec(args["tokenizer"], read_meta(Path(args["shards_dir"])))
        return codec_from_path(args["shards_dir"])
    if args.get("text_file"):
        text_file = Path(args["text_file"])
        if not text_file.is_file():
            raise UserInputError(f"the recipe's text file {text_file} is not found")
        return char_codec(text_file.read_text(encoding="utf-8"), str(text_file))
    text = resources.files("lit.data").joinpath(f"{EMBEDDED_CORPUS}.txt").read_text(encoding="utf-8")
    return char_codec(text, f"the embedded {EMBEDDED_CORPUS}")


def resolve_codec(model_vocab_size: int, tokenizer: str | None, recipe: str | None, *, trained: dict | None = None,
                  checkpoint: str = "the checkpoint", force: bool = False) -> TextCodec:
    """The checkpoint's codec from ``--tokenizer`` or ``--config``, else from its ``trained`` record; checked
    against the model's vocabulary and against the record."""
    if tokenizer is None and recipe is None:
        codec = codec_from_record(trained, checkpoint)
    else:
        codec = codec_from_path(tokenizer) if tokenizer is not None else codec_from_recipe(recipe)
        tokenizer_record.check(trained, codec.record, checkpoint, force=force,
                               fix="give the tokenizer the model was trained with (or drop --tokenizer/--config to "
                                   "use the one its checkpoint records)")
    fits = codec.vocab_size == model_vocab_size if codec.exact_vocabulary else codec.vocab_size <= model_vocab_size
    if not fits:
        raise UserInputError(f"lm-eval: the {codec.description} has {codec.vocab_size} tokens but the checkpoint's "
                             f"vocabulary is {model_vocab_size}; give the tokenizer the model was trained with")
    return codec


def codec_from_record(trained: dict | None, checkpoint: str) -> TextCodec:
    """The codec of the tokenizer a checkpoint records, where it was when the model was trained."""
    if trained is None:
        raise UserInputError(f"{checkpoint} records no tokenizer (written before checkpoints carried one); give "
                             f"--tokenizer (tokenizer.json or the shards directory) or --config (the recipe the model "
                             f"was trained with)")
    if trained["kind"] != "characters":
        return bpe_codec(tokenizer_record.recorded_tokenizer_file(trained, checkpoint))
    from lit.data.text import EMBEDDED_CORPUS

    path = Path(trained["path"])
    if trained["path"] == f"lit/data/{EMBEDDED_CORPUS}.txt":
        text = resources.files("lit.data").joinpath(f"{EMBEDDED_CORPUS}.txt").read_text(encoding="utf-8")
        codec = char_codec(text, trained["path"])
    elif path.is_file():
        codec = char_codec(path.read_text(encoding="utf-8"), str(path))
    else:
        raise UserInputError(f"{checkpoint} was trained on the characters of {path}, which is not there; give "
                             f"--config with the recipe and its text file")
    tokenizer_record.check(trained, codec.record, checkpoint,
                           fix=f"the file at {path} changed since training; give the original with --tokenizer")
    return codec
