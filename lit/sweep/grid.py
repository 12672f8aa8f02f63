"""From ``--vary`` / ``--variant`` / ``--seeds`` / ``--tune`` to the list of child runs of a sweep (pure data).

A variant is a set of config overrides (``model.arch.norm=dyt``) on top of the recipe. ``--vary KEY=V1,V2``
options multiply into a grid; each ``--variant KEY=V[,KEY=V...]`` adds one explicit variant (the key
``config`` layers another YAML file on the recipe, e.g. a whole nGPT recipe). Each variant runs once per
seed; seed i is the init seed and the data-order seed of that run in every variant, so differences pair.

Tuning: for each variant, the tuned key (a learning rate, typically) takes each of the given values on the
tuning seed, the best value on the validation metric is picked, and the seeds run at it. By default the
tuning seed lies outside the evaluation seeds and the tuning runs are never counted among the results
(rule ``separate_seed``): a result picked as the best of several is biased towards luck. The old rule,
tuning at the full budget on the first evaluation seed and reusing the picked run as that seed's result
(``reuse_seed_run``: |values| - 1 runs fewer per variant, a small optimistic bias), is kept for those who
ask for it by name.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lit.errors import UserInputError

CONFIG_KEY = "config"  # the override key that layers a YAML file instead of setting one value


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets, braces and quotes: ``a,[1, 2],b`` -> ``a``, ``[1, 2]``, ``b``."""
    parts, depth, quote, current = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    key = key.strip().removeprefix("--")
    if not eq or not key or not value.strip():
        raise UserInputError(f"{option} {text!r} is not KEY=VALUE (e.g. {option} model.arch.norm=dyt)")
    return key, value.strip()


def parse_values(text: str, option: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2,...`` -> (key, [V1, V2, ...])."""
    key, values = parse_assignment(text, option)
    items = split_top_level(values)
    if any(not v for v in items):
        raise UserInputError(f"{option} {text!r} has an empty value; write KEY=V1,V2,...")
    if len(set(items)) != len(items):
        raise UserInputError(f"{option} {text!r} repeats a value")
    return key, items


def parse_variant(text: str) -> dict[str, str]:
    """``KEY=V[,KEY=V...]`` -> overrides; a comma starts a new assignment only where ``KEY=`` follows."""
    overrides: dict[str, str] = {}
    pending: list[str] = []
    for part in split_top_level(text):
        if "=" in part.split("[")[0] and not pending:
            pending = [part]
        elif "=" in part.split("[")[0]:
            key, value = parse_assignment(",".join(pending), "--variant")
            overrides[key] = value
            pending = [part]
        else:  # a comma inside a value written without brackets
            pending.append(part)
    if pending:
        key, value = parse_assignment(",".join(pending), "--variant")
        overrides[key] = value
    if not overrides:
        raise UserInputError("--variant needs KEY=VALUE (e.g. --variant model.arch.norm=dyt)")
    return overrides


def option_value(args: list[str], key: str) -> str | None:
    """The last value a list of ``--key=value`` / ``--key value`` options gives ``key``."""
    value = None
    for i, arg in enumerate(args):
        if arg == f"--{key}" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(f"--{key}="):
            value = arg.split("=", 1)[1]
    return value


def short_key(key: str) -> str:
    """The last part of a config key, as a label shows it: ``model.arch.norm`` -> ``norm``."""
    return Path(key).stem if key == CONFIG_KEY else key.rsplit(".", 1)[-1]


def label_of(overrides: dict[str, str]) -> str:
    if not overrides:
        return "recipe"
    return ",".join(f"{short_key(k)}={Path(v).stem if k == CONFIG_KEY else v}" for k, v in overrides.items())


@dataclass(frozen=True)
class Variant:
    label: str
    overrides: dict[str, str] = field(default_factory=dict)


SEPARATE_SEED, REUSE_SEED_RUN = "separate_seed", "reuse_seed_run"  # the tuning rules


@dataclass(frozen=True)
class Tuning:
    key: str
    values: list[str]
    steps: int | None  # None: the full budget
    seed: int
    reuse_seed_run: bool

    @property
    def rule(self) -> str:
        return REUSE_SEED_RUN if self.reuse_seed_run else SEPARATE_SEED

    @property
    def description(self) -> str:
        budget = "the full budget" if self.steps is None else f"{self.steps} steps"
        what = ("; the tuning run at the picked value is reused as that seed's run" if self.reuse_seed_run
                else "; the tuning runs are not counted, every evaluation seed runs at the picked value")
        return (f"for each variant, {self.key} in {{{', '.join(self.values)}}} on seed {self.seed} at {budget}; "
                f"the value with the best final validation metric is picked{what}")


def build_variants(vary: list[str], variants: list[str]) -> list[Variant]:
    """The grid of ``--vary`` options, then each ``--variant``. With only ``--variant`` options the recipe
    itself comes first (an ablation swaps one thing at a time against it); with neither, the recipe alone
    runs over the seeds (a replication: its mean and interval)."""
    axes = [parse_values(v, "--vary") for v in vary]
    keys = [k for k, _ in axes]
    if len(set(keys)) != len(keys):
        raise UserInputError(f"--vary names a key twice: {sorted(k for k in keys if keys.count(k) > 1)[0]}")
    grid = itertools.product(*(vals for _, vals in axes))
    out = [dict(zip(keys, combo, strict=True)) for combo in grid] if axes else []
    explicit = [parse_variant(v) for v in variants]
    if explicit and not axes:
        out.append({})
    out += explicit
    if not out:
        out.append({})  # nothing varied: the recipe alone, replicated over the seeds (its spread, its interval)
    result, seen = [], {}
    for overrides in out:
        label = label_of(overrides)
        if label in seen:
            raise UserInputError(f"variant {label!r} is given twice")
        seen[label] = overrides
        result.append(Variant(label, overrides))
    return result


def find_baseline(variants: list[Variant], baseline: str | None) -> Variant:
    """``--baseline KEY=V[,KEY=V]`` or a label; default the first variant."""
    if baseline is None:
        return variants[0]
    by_label = {v.label: v for v in variants}
    if baseline in by_label:
        return by_label[baseline]
    wanted = parse_variant(baseline)
    matches = [v for v in variants if all(v.overrides.get(k) == val for k, val in wanted.items())]
    if len(matches) != 1:
        what = "no variant" if not matches else f"{len(matches)} variants"
        raise UserInputError(f"--baseline {baseline} matches {what}; use one of the labels: "
                             f"{', '.join(by_label)}")
    return matches[0]


@dataclass(frozen=True)
class Child:
    """One child run: a variant at one seed, in the tuning or the seed phase."""

    key: str  # unique within the sweep; a rerun of the sweep finds the child's runs by it
    variant: str
    phase: str  # "tune", "seed", or "shared" (a seed run at the baseline's tuned value)
    seed: int
    seed_index: int
    overrides: dict[str, str]  # the variant's, plus the tuned value for tuning runs
    steps: int | None = None  # a budget other than the sweep's (shorter tuning runs)
    tune_value: str | None = None  # tuning runs: their value; seed runs of a tuned variant: None until picked
    reuse: bool = False  # a seed run that is the tuning run at the picked value (nothing to train)
    rung: int | None = None  # a ladder sweep's rung (lit/sweep/ladder.py); None outside a ladder

    def to_json(self) -> dict:
        return asdict(self)


def build_children(variants: list[Variant], seeds: list[int], tuning: Tuning | None,
                   shared_with: str | None = None) -> list[Child]:
    """Tuning runs of every variant first (their results gate the seeds), then the seed runs; with ``shared_with``
    (the baseline's label, ``--shared_value``), then every other variant's seeds at the baseline's tuned value."""
    tune_runs, seed_runs, shared_runs = [], [], []
    for v in variants:
        if tuning is not None:
            for value in tuning.values:
                tune_runs.append(Child(f"{v.label}|tune|{tuning.key}={value}", v.label, "tune", tuning.seed, 0,
                                       {**v.overrides, tuning.key: value}, tuning.steps, value))
        for i, seed in enumerate(seeds):
            reuse = tuning is not None and tuning.reuse_seed_run and seed == tuning.seed
            seed_runs.append(Child(f"{v.label}|seed|{seed}", v.label, "seed", seed, i, dict(v.overrides),
                                   reuse=reuse))
            if shared_with is not None and v.label != shared_with:
                shared_runs.append(Child(f"{v.label}|shared|{seed}", v.label, "shared", seed, i, dict(v.overrides)))
    return tune_runs + seed_runs + shared_runs


def sweep_id(core: dict) -> str:
    """A stable id of what a sweep runs: the same command finds its parent run again (resume)."""
    return hashlib.sha1(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]
