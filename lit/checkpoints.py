"""Checkpoint files: read safely, checked against the model before a run starts, made portable.

- Reading is weights-only: tensors, containers and our own config types, never arbitrary pickled
  objects, so a checkpoint from elsewhere cannot run code.
- ``checkpoint_shapes`` and ``check_fits`` run before Lightning touches a ``--ckpt_path``: a corrupt
  file, a foreign object or weights of another architecture end in one line saying what to do, not
  in a traceback mid-setup.
- ``export`` turns a sharded FSDP2 checkpoint (a directory of per-rank shards) into one ordinary
  Lightning checkpoint file, loadable on one process, optimizer state included:

      python cli.py export runs/<exp>/<run>/checkpoints/last.ckpt model.ckpt

- Lightning keeps no random states in checkpoints; ``rng_states`` adds them, so that dropout,
  drop-path and batch mixing continue exactly after a resume.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.init_from import load_weights_only

SHARDED_METADATA = "meta.pt"  # Lightning's non-tensor part of a sharded checkpoint (written by rank 0)
STATE_PREFIX = "state_dict."  # how the model's entries are named inside a sharded checkpoint


def is_sharded(path: Path) -> bool:
    return path.is_dir() and (path / SHARDED_METADATA).is_file()


def checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every model entry of a checkpoint file or sharded directory (nothing else is read)."""
    path = Path(path)
    if not path.exists():
        raise UserInputError(f"checkpoint {path} not found; pass a .ckpt file or a sharded checkpoint directory")
    if path.is_dir():
        if not is_sharded(path):
            raise UserInputError(f"{path} is a directory, not a sharded Lightning checkpoint (no {SHARDED_METADATA})")
        from torch.distributed.checkpoint import FileSystemReader

        load_weights_only(path / SHARDED_METADATA)
        try:
            entries = FileSystemReader(str(path)).read_metadata().state_dict_metadata
        except Exception as exc:
            raise UserInputError(f"cannot read the shard index of {path}: {exc}") from exc
        return {k[len(STATE_PREFIX):]: tuple(m.size) for k, m in entries.items()
                if k.startswith(STATE_PREFIX) and hasattr(m, "size")}
    checkpoint = load_weights_only(path)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserInputError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    return {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items() if isinstance(v, torch.Tensor)}


def check_fits(path: str | Path, found: dict[str, tuple[int, ...]], model: nn.Module) -> None:
    """One line, before any training, if the checkpoint at ``path`` (its ``checkpoint_shapes``) holds another
    architecture than ``model``."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    resized = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    if not (missing or unexpected or resized):
        return
    problems = []
    if resized:
        k = resized[0]
        problems.append(f"{len(resized)} shapes differ ({k}: checkpoint {found[k]}, model {expected[k]})")
    if missing:
        problems.append(f"{len(missing)} missing ({missing[0]}, ...)")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected ({unexpected[0]}, ...)")
    raise UserInputError(f"checkpoint {path} does not fit this model: {'; '.join(problems)}. Use the recipe and "
                         f"overrides it was trained with, or --model.init_from to start from its weights")


def rng_states() -> dict[str, Any]:
    states = {"torch": torch.get_rng_state(), "numpy": list(np.random.get_state()[1:]), "python": random.getstate()}
    states["numpy"][0] = states["numpy"][0].tolist()  # plain ints: weights-only loading refuses numpy arrays
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(_as_tuples(states["python"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_tuples(value):
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def export(sharded_dir: str | Path, out_file: str | Path) -> Path:
    """One Lightning checkpoint file from a sharded FSDP2 checkpoint directory (full tensors, on CPU).

    The optimizer state is renumbered from parameter names (how FSDP2 saves it) to positions (how a
    plain optimizer loads it), so the file resumes training on one process too.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    sharded_dir, out_file = Path(sharded_dir), Path(out_file)
    if not is_sharded(sharded_dir):
        raise UserInputError(f"{sharded_dir} is not a sharded Lightning checkpoint directory (no {SHARDED_METADATA})")
    checkpoint = load_weights_only(sharded_dir / SHARDED_METADATA)
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(sharded_dir, Path(tmp) / "full.pt")
        tensors = torch.load(Path(tmp) / "full.pt", map_location="cpu", weights_only=True)
    checkpoint["state_dict"] = tensors.pop("state_dict")
    optimizers = sorted((k for k in tensors if k.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    checkpoint["optimizer_states"] = [positional_optimizer_state(tensors[k]) for k in optimizers]
    out_file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out_file)
    return out_file


def positional_optimizer_state(by_name: dict[str, Any]) -> dict[str, Any]:
    """A name-keyed optimizer state (``get_optimizer_state_dict``) as ``Optimizer.load_state_dict`` takes it."""
    position = {name: i for i, name in enumerate(n for group in by_name["param_groups"] for n in group["params"])}
    return {"state": {position[name]: state for name, state in by_name["state"].items()},
            "param_groups": [{**group, "params": [position[n] for n in group["params"]]}
                             for group in by_name["param_groups"]]}


@one_line_errors
def main(argv: list[str]) -> int:
    """``python cli.py export SHARDED_DIR OUT_FILE``."""
    parser = OneLineArgumentParser(prog="cli.py export", description="a sharded checkpoint directory -> one "
                                   "checkpoint file (Lightning's format, loads anywhere)")
    parser.add_argument("sharded_dir")
    parser.add_argument("out_file")
    args = parser.parse_args(argv)
    print(export(args.sharded_dir, args.out_file))
    return 0
