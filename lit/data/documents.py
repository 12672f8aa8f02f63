"""A corpus on disk read as a stream of documents: text files, JSONL, parquet, or a Hugging Face ``datasets``
folder written by ``save_to_disk``. Both ``train-tokenizer`` and ``prepare-data`` read their inputs here, so a
tokenizer is trained on exactly the documents that are then encoded.

Nothing is read whole: a long document arrives as pieces of about ``piece_chars`` characters, cut only at a lone
newline between non-space characters. Byte-level BPE (GPT-2's pre-tokenizer regex) always splits on both sides of
it, so encoding the pieces one by one gives the same ids as encoding the document at once. (A text with no such
newline, one huge line, is read whole.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lit.errors import UserInputError

TEXT_UNITS = ("file", "paragraph", "line")
PIECE_CHARS = 1 << 20


@dataclass(frozen=True)
class Piece:
    """Text of one document (all of it, or a part); ``starts_document`` marks the first part of each."""

    text: str
    starts_document: bool


def input_kind(path: Path) -> str:
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise UserInputError(f"{path} holds several splits ({', '.join(splits)}); pass one split's folder, "
                                 f"e.g. {path / (splits[0] if splits else 'train')}")
        if (path / "state.json").exists():
            return "datasets"
        raise UserInputError(f"{path} is a folder but not a Hugging Face datasets folder (no state.json); pass "
                             f"files (.txt, .jsonl, .parquet) or a folder written by Dataset.save_to_disk")
    if not path.is_file():
        raise UserInputError(f"input {path} not found; pass text, .jsonl or .parquet files or a datasets folder")
    if path.suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    return "text"


class Corpus:
    """The documents of ``inputs``, in order. ``bytes_read`` says how far the reading has got (in input bytes,
    against ``total_bytes``), for progress and ETA.

    Args:
        inputs: files or folders; the kind of each comes from its suffix (``.jsonl``/``.ndjson``, ``.parquet``,
            a ``datasets`` folder; anything else is UTF-8 text).
        text_key: the field (JSONL) or column (parquet, datasets) holding each record's text.
        text_unit: what a document is in a text file: the whole ``file``, each ``paragraph`` (blank-line
            separated) or each non-empty ``line``.

    ``cut_at`` (byte offsets, ascending; ``file`` unit only): a text file also starts a new document at the first
    line that starts at or after each offset (how ``prepare-data`` splits one text file by position).
    """

    def __init__(self, inputs: list[str], text_key: str = "text", text_unit: str = "file",
                 piece_chars: int = PIECE_CHARS):
        if text_unit not in TEXT_UNITS:
            raise UserInputError(f"--text_unit must be one of {', '.join(TEXT_UNITS)}, got {text_unit!r}")
        if not inputs:
            raise UserInputError("no inputs given; pass text, .jsonl or .parquet files or a datasets folder")
        self.paths = [Path(p) for p in inputs]
        self.kinds = [input_kind(p) for p in self.paths]
        self.text_key, self.text_unit, self.piece_chars = text_key, text_unit, piece_chars
        self.total_bytes = sum(_size(p) for p in self.paths)
        self.bytes_read = 0
        self.cut_at: tuple[int, ...] = ()

    def __iter__(self) -> Iterator[Piece]:
        self.bytes_read = 0
        readers = {"text": self._text, "jsonl": self._jsonl, "parquet": self._parquet, "datasets": self._datasets}
        for path, kind in zip(self.paths, self.kinds, strict=True):
            done_before = self.bytes_read
            yield from readers[kind](path)
            self.bytes_read = done_before + _size(path)

    def texts(self) -> Iterator[str]:
        """Every piece's text (what a tokenizer trains on)."""
        return (piece.text for piece in self)

    def _text(self, path: Path) -> Iterator[Piece]:
        buffer: list[str] = []
        size, first = 0, True
        cuts, position = list(self.cut_at), 0  # position: the current line's first byte in the file
        with open(path, "rb") as f:
            for raw in f:
                self.bytes_read += len(raw)
                line = _decode(raw, path)
                line_start, position = position, position + len(raw)
                if self.text_unit == "line":
                    if line.strip():
                        yield Piece(line.rstrip("\n"), True)
                    continue
                if self.text_unit == "paragraph" and not line.strip():
                    if buffer:
                        yield Piece("".join(buffer), first)
                        buffer, size, first = [], 0, True
                    continue
                if cuts and line_start >= cuts[0]:
                    while cuts and line_start >= cuts[0]:
                        cuts.pop(0)
                    if buffer:
                        yield Piece("".join(buffer), first)
                    buffer, size, first = [], 0, True
                elif size >= self.piece_chars and _cuttable(buffer[-1], line):
                    yield Piece("".join(buffer), first)  # a cut BPE's pre-tokenizer also makes: see the docstring
                    buffer, size, first = [], 0, False
                buffer.append(line)
                size += len(line)
        if buffer:
            yield Piece("".join(buffer), first)

    def _record_text(self, value, where: str) -> str:
        if not isinstance(value, str):
            raise UserInputError(f"{where}: field {self.text_key!r} is {type(value).__name__}, not text; pass the "
                                 f"field that holds the text with --text_key")
        return value

    def _jsonl(self, path: Path) -> Iterator[Piece]:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                self.bytes_read += len(raw)
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise UserInputError(f"{path}:{number} is not JSON ({e.msg}); each line must be one object") from e
                if not isinstance(record, dict) or self.text_key not in record:
                    raise UserInputError(f"{path}:{number} has no {self.text_key!r} field; name the text field with "
                                         f"--text_key")
                yield Piece(self._record_text(record[self.text_key], f"{path}:{number}"), True)

    def _parquet(self, path: Path) -> Iterator[Piece]:
        import pyarrow.parquet as pq

        file = pq.ParquetFile(path)
        self._check_column(file.schema_arrow.names, path)
        rows, size = max(1, file.metadata.num_rows), _size(path)
        done_before, seen = self.bytes_read, 0
        for batch in file.iter_batches(batch_size=1024, columns=[self.text_key]):
            yield from self._column_pieces(batch.column(0), path)
            seen += batch.num_rows
            self.bytes_read = done_before + size * seen // rows

    def _datasets(self, path: Path) -> Iterator[Piece]:
        import pyarrow as pa

        state = json.loads((path / "state.json").read_text())
        for entry in state.get("_data_files", []):
            arrow = path / entry["filename"]
            with pa.memory_map(str(arrow)) as source:
                reader = pa.ipc.open_stream(source)  # what save_to_disk writes
                self._check_column(reader.schema.names, path)
                for batch in reader:
                    yield from self._column_pieces(batch.column(reader.schema.get_field_index(self.text_key)), path)
            self.bytes_read += _size(arrow)

    def _check_column(self, names: list[str], path: Path) -> None:
        if self.text_key not in names:
            raise UserInputError(f"{path} has no column {self.text_key!r} (it has {', '.join(names)}); name the text "
                                 f"column with --text_key")

    def _column_pieces(self, column, path: Path) -> Iterator[Piece]:
        for value in column.to_pylist():
            if value is not None:
                yield Piece(self._record_text(value, str(path)), True)


def _cuttable(line: str, next_line: str) -> bool:
    """Whether GPT-2's pre-tokenizer regex always splits between ``line`` and ``next_line`` and on both sides of
    ``line``'s newline: a lone newline with non-space text on both sides. (After a run of whitespace it would not:
    the run's last character joins the run when the text ends there, and splits off when text follows.)"""
    return len(line) >= 2 and not line[-2].isspace() and next_line[:1] != "" and not next_line[:1].isspace()


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserInputError(f"{path} is not UTF-8 text ({e.reason} at a byte near {e.start}); convert it or pass "
                             f"JSONL/parquet") from e


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.glob("*.arrow"))
    return path.stat().st_size
