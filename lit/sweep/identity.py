"""What a sweep's results depend on besides its command line: the files it reads and the code that runs.

The recipe, every variant's ``config=FILE`` and the code's git commit are fingerprinted when a sweep
starts and stored in its protocol (``"identity"``). Resuming compares them: runs of an edited recipe or
of other code must not be pooled with the old ones, so a change refuses in one line naming it, unless
the user asks for a new sweep (``--new_sweep``).

A dirty work tree is recorded (``"dirty": true``) but does not refuse by itself: its content is not
fingerprinted (that would refuse after every edit while developing), so a sweep meant for a report
should run from a clean commit, which the protocol then proves.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from lit.errors import UserInputError
from lit.sweep.grid import CONFIG_KEY, Variant


def file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UserInputError(f"cannot read {path}: {exc}") from exc


def variant_files(variants: list[Variant]) -> dict[str, str]:
    """Every ``config=FILE`` of the variants, by the path as given, with its content's hash."""
    files = {}
    for v in variants:
        for key, value in v.overrides.items():
            if key == CONFIG_KEY:
                path = Path(value)
                if not path.is_file():
                    raise UserInputError(f"variant {v.label}: config file {value} not found")
                files[value] = file_sha256(path)
    return files


def identity(recipe: Path, variants: list[Variant]) -> dict:
    from lit.tracking.config_log import git_commit

    commit = git_commit()
    return {"recipe_sha256": file_sha256(recipe), "variant_files": variant_files(variants),
            "commit": commit[0] if commit else None, "dirty": bool(commit and commit[1])}


def changes(stored: dict | None, current: dict) -> list[str]:
    """What differs between a sweep's stored identity and the current one, in words (empty: nothing)."""
    if stored is None:
        return ["the sweep was started before sweeps recorded their inputs"]
    out = []
    if stored.get("recipe_sha256") != current["recipe_sha256"]:
        out.append("the recipe's content")
    old, new = stored.get("variant_files", {}), current["variant_files"]
    out += [f"config file {path}" for path in sorted(set(old) | set(new)) if old.get(path) != new.get(path)]
    if stored.get("commit") != current["commit"]:
        out.append(f"the code commit ({str(stored.get('commit'))[:10]} -> {str(current['commit'])[:10]})")
    return out
