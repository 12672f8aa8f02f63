"""A scaling ladder in a sweep: the rungs (model sizes), each rung's token budget, and its learning rate rule.

``--ladder`` lists the rungs, separated by ``;``, each a set of architecture keys (``d_model=64,n_layers=2,
n_heads=2``; a key without a dot is under ``model.init_args.arch``, a dotted key is a full config key), or names
a YAML file holding a list of such mappings. A rung's training tokens are either its own (``tokens=2e6`` in the
rung) or ``--tokens_per_param`` times the baseline's non-embedding parameters at that rung (Chinchilla's 20 is
compute-optimal for large models). Every variant trains on the same tokens at a rung (the same data, paired by
seed); a variant that adds matrices spends more FLOPs there, which the multiplier accounts for by reading each
run's own ``train/flops``.

The tokens become optimizer steps through the recipe's tokens per step (batch x block x accumulation), rounded up
to a whole number of logging intervals, so the run's last logged ``train/flops`` is its total. Validation runs
once, at the last step: the ladder reads the final value only.

GPUs per rung. A rung may set its own ``gpus_per_run=K`` (``d_model=512,n_layers=8,gpus_per_run=4``): its runs
train on K GPUs (DDP or FSDP2), beside the other rungs' on their own GPUs (``lit/sweep/placement.py``). A rung whose
runs span K > 1 devices (its own K, or the sweep's ``--gpus_per_run``) trains the recipe's batch split K ways
(``batch_size / K`` per rank): the data order gives K ranks at batch b/K exactly the samples one process at batch b
trains on (``lit/data/resumable.py``), so the rung's steps, tokens and numbers do not depend on where it runs.

Learning rate. ``fixed`` runs the recipe's learning rate at every rung and says so: under the standard
parametrization the optimum drifts with width, and the multiplier then mixes the architecture's gain with
its learning-rate sensitivity. ``transfer`` keeps the recipe's (base-width) learning rate and leaves the
per-width scaling to the recipe's parametrization plugin, so it requires one that is not ``sp`` and, for the
built-in ones, a base width equal to the recipe's d_model (where its learning rate was tuned). With
``--ladder_lr_check`` every rung also runs lr/2 and 2 lr on the first seed (not counted), so the report can say
whether the rung's learning rate is at an edge of that three-point grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lit.errors import UserInputError
from lit.sweep.grid import CONFIG_KEY, option_value, parse_variant

ARCH_PREFIX = "model.init_args.arch."
LR_KEY = "model.init_args.lr"
TOKENS = "tokens"  # a rung's explicit token budget
GPUS = "gpus_per_run"  # a rung's own GPUs per run (placement, not model: its runs train the same global batch)
DEVICES_KEY = "trainer.devices"
BATCH_KEY = "data.init_args.batch_size"
LR_RULES = ("fixed", "transfer")
LR_CHECK_FACTORS = (0.5, 2.0)
LR_CHECK_SCOPES = ("all", "baseline")  # one factor-2 grid step either side of the rung's learning rate
PARAMETRIZATION_KEY = "parametrization"  # under model.init_args.arch, once parametrization plugins exist
OPTIONS_KEY = "parametrization_options"
WIDTH_TRANSFER = ("mup", "mup_wd", "completep")  # the built-ins that scale from a base width (m_d = 1 without one)
DEFAULT_LOG_EVERY = 50  # Lightning's default log_every_n_steps


@dataclass(frozen=True)
class Rung:
    """One rung as the user wrote it: config overrides (full keys) and, optionally, its own token budget."""

    label: str  # as written, e.g. "d_model=64,n_layers=2,n_heads=2"
    overrides: dict[str, str]
    tokens: float | None = None
    gpus_per_run: int | None = None  # None: the sweep's --gpus_per_run


@dataclass(frozen=True)
class SizedRung:
    """A rung with its budget worked out: what every child run at this rung is told."""

    index: int
    label: str
    overrides: dict[str, str]  # architecture keys, plus the budget and validation schedule the ladder owns
    parameters: int  # the baseline's non-embedding parameters at this rung
    flops_per_token: float  # the baseline's training FLOPs per token at this rung
    tokens: int  # training tokens (steps x tokens per step)
    steps: int
    gpus_per_run: int | None = None  # the rung's own GPUs per run, if it sets them
    compute: float = field(init=False)  # the baseline's planned training FLOPs

    def __post_init__(self):
        object.__setattr__(self, "compute", self.flops_per_token * self.tokens)

    def to_json(self) -> dict:
        out = {"index": self.index, "label": self.label, "overrides": self.overrides,
               "parameters": self.parameters, "flops_per_token": self.flops_per_token, "tokens": self.tokens,
               "steps": self.steps, "compute": self.compute}
        if self.gpus_per_run is not None:  # absent otherwise: the ids of ladders written before it stand
            out[GPUS] = self.gpus_per_run
        return out


def _full_key(key: str) -> str:
    return key if "." in key else ARCH_PREFIX + key


def _tokens(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or math.isinf(value):
        raise UserInputError(f"{where}: tokens={text!r} is not a positive number (like tokens=2e6)")
    return value


def _gpus(text: str, where: str) -> int:
    value = int(text) if text.strip().isdigit() else 0
    if value < 1:
        raise UserInputError(f"{where}: gpus_per_run={text!r} is not a whole number of GPUs of at least 1 "
                             "(like gpus_per_run=4)")
    return value


def _rung(overrides: dict[str, str], where: str) -> Rung:
    tokens = overrides.pop(TOKENS, None)
    gpus = overrides.pop(GPUS, None)
    if not overrides:
        raise UserInputError(f"{where} sets no model key; write e.g. d_model=64,n_layers=2,n_heads=2")
    label = ",".join(f"{k}={v}" for k, v in overrides.items())
    full = {_full_key(k): str(v) for k, v in overrides.items()}
    return Rung(label, full, None if tokens is None else _tokens(str(tokens), where),
                None if gpus is None else _gpus(str(gpus), where))


def parse_ladder(text: str) -> list[Rung]:
    """``--ladder``: rungs separated by ``;`` (``d_model=32,n_heads=2;d_model=64,n_heads=4``), or a YAML file
    holding a list of mappings. At least 3 rungs (a saturating law has 3 parameters per variant)."""
    path = Path(text)
    if text.endswith((".yaml", ".yml")) or path.is_file():
        try:
            items = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise UserInputError(f"--ladder {text}: cannot read it as a YAML list of rungs ({exc})") from None
        if not isinstance(items, list) or not all(isinstance(i, dict) and i for i in items):
            raise UserInputError(f"--ladder {text}: expected a YAML list of mappings, one per rung "
                                 "(- {d_model: 64, n_layers: 2, n_heads: 2})")
        rungs = [_rung({str(k): str(v) for k, v in item.items()}, f"--ladder {text} rung {i + 1}")
                 for i, item in enumerate(items)]
    else:
        parts = [p.strip() for p in text.split(";") if p.strip()]
        rungs = [_rung(parse_variant(p), f"--ladder rung {i + 1} ({p!r})") for i, p in enumerate(parts)]
    if len(rungs) < 3:
        raise UserInputError(f"--ladder has {len(rungs)} rung(s); a scaling law needs at least 3 (4 spanning "
                             "16x compute or more is the smallest ladder anyone fits), separated by ';'")
    labels = [r.label for r in rungs]
    if len(set(labels)) != len(labels):
        raise UserInputError(f"--ladder repeats a rung: {next(x for x in labels if labels.count(x) > 1)}")
    return rungs


def _options(options, fit_options: list[str], overrides: dict[str, str], key: str) -> dict:
    """The parametrization's options: the recipe's mapping, then a whole mapping given as an option or override
    (YAML), then single ``key.option=value`` settings."""
    options = dict(options) if isinstance(options, dict) else {}
    given = option_value(fit_options, key) or overrides.get(key)
    if given:
        parsed = yaml.safe_load(given)
        options = dict(parsed) if isinstance(parsed, dict) else options
    for name in ("base_width", "base_head_dim", "base_heads", "base_depth"):
        one = option_value(fit_options, f"{key}.{name}") or overrides.get(f"{key}.{name}")
        if one:
            options[name] = yaml.safe_load(one)
    return options


def check_lr_rule(rule: str, arch: dict) -> str:
    """The ladder's learning-rate rule, in words, or an error when ``transfer`` has nothing to transfer by: no
    parametrization, or a built-in width-transferring one without its base width, or a recipe whose d_model is
    not that base width (its learning rate was tuned at the base shape, and the rungs scale from there)."""
    name = str(arch.get(PARAMETRIZATION_KEY) or "sp")
    if rule == "transfer" and name == "sp":
        raise UserInputError("--ladder_lr transfer needs a parametrization that transfers the learning rate "
                             f"across widths (model.init_args.arch.{PARAMETRIZATION_KEY}: mup or completep); this "
                             "recipe uses the standard one (sp); pass --ladder_lr fixed to run its lr at every rung")
    if rule == "transfer":
        base = (arch.get(OPTIONS_KEY) or {}).get("base_width")
        if name in WIDTH_TRANSFER and base is None:
            raise UserInputError(f"--ladder_lr transfer: the recipe's {name} parametrization has no base width, so "
                                 "every rung would run its one learning rate under what is the standard "
                                 f"parametrization; set model.init_args.arch.{OPTIONS_KEY}.base_width (and "
                                 "base_heads or base_head_dim) to the d_model its learning rate was tuned at")
        d_model = arch.get("d_model")
        if base is not None and d_model is not None and str(d_model) != str(base):
            raise UserInputError(f"--ladder_lr transfer: the recipe's d_model {d_model} is not its base width "
                                 f"{base}; its learning rate must be the one tuned at the base shape, so set "
                                 f"d_model to {base} (or base_width to {d_model}, if its lr was tuned there)")
        at = f" (base width {base})" if base is not None else ""
        return (f"the recipe's learning rate at its base width{at}, transferred to each rung by the {name} "
                "parametrization")
    return ("the recipe's learning rate at every rung, not transferred (standard parametrization): the multiplier "
            "includes each variant's sensitivity to a learning rate that drifts off its optimum with width")


def steps_for(tokens: float, tokens_per_step: int, log_every: int) -> int:
    """Optimizer steps covering ``tokens``, rounded up to whole logging intervals (the last step is logged)."""
    steps = math.ceil(tokens / tokens_per_step)
    return max(log_every, log_every * math.ceil(steps / log_every))


def size_rungs(rungs: list[Rung], measured: list[tuple[int, float, int]], tokens_per_param: float | None,
               log_every: int) -> list[SizedRung]:
    """Each rung's budget from what the baseline measures at that size: ``measured[r]`` = (non-embedding
    parameters, training FLOPs per token, tokens per optimizer step)."""
    sized = []
    for i, (rung, (params, flops, per_step)) in enumerate(zip(rungs, measured, strict=True)):
        if rung.tokens is None and tokens_per_param is None:
            raise UserInputError(f"--ladder rung {i + 1} ({rung.label}) has no token budget; pass "
                                 "--tokens_per_param R (e.g. 20) or give the rung tokens=N")
        tokens = rung.tokens if rung.tokens is not None else tokens_per_param * params
        steps = steps_for(tokens, per_step, log_every)
        overrides = {**rung.overrides, "trainer.max_steps": str(steps), "trainer.val_check_interval": str(steps),
                     "trainer.check_val_every_n_epoch": "null"}
        if rung.gpus_per_run is not None:  # placement gives every run the sweep's count first; the rung's wins
            overrides[DEVICES_KEY] = str(rung.gpus_per_run)
        sized.append(SizedRung(i, rung.label, overrides, params, flops, steps * per_step, steps, rung.gpus_per_run))
    computes = [r.compute for r in sized]
    if any(b <= a for a, b in zip(computes, computes[1:], strict=False)):
        raise UserInputError("--ladder rungs must grow in compute, smallest first; planned FLOPs: "
                             + ", ".join(f"{c:.3g}" for c in computes))
    return sized


def split_batches(sized: list[SizedRung], sweep_devices: int, batches: dict[str, int | None]) -> None:
    """A rung whose runs span K > 1 devices trains the recipe's batch split K ways (``batch_size / K`` per rank), so
    its steps and tokens are those it was sized for: ``batches`` is each variant's batch, which must be one."""
    spans = {r.index: r.gpus_per_run or sweep_devices for r in sized}
    if all(k == 1 for k in spans.values()):
        return
    missing = next((label for label, b in batches.items() if b is None), None)
    if missing is not None:
        raise UserInputError(f"--ladder: a rung trains on several devices, so its batch is split between them, and "
                             f"variant {missing!r}'s batch size ({BATCH_KEY}) is not in its recipe or overrides; "
                             "set it there")
    known = set(batches.values())
    if len(known) != 1:
        found = ", ".join(f"{label}: {b}" for label, b in batches.items())
        raise UserInputError(f"--ladder: a rung trains on several devices, so its batch is split between them, and "
                             f"the variants' batch sizes are not one number ({found}); give every variant the same "
                             f"{BATCH_KEY}")
    batch = known.pop()
    for r in sized:
        k = spans[r.index]
        if k > 1 and batch % k:
            raise UserInputError(f"--ladder rung {r.index + 1} ({r.label}) trains on {k} devices and the batch of "
                                 f"{batch} does not split into {k} equal parts; pick a batch size divisible by {k} "
                                 "or another gpus_per_run")
        if k > 1:
            r.overrides[BATCH_KEY] = str(batch // k)


def sweep_devices(a, fit_options: list[str]) -> int:
    """Devices each run trains on when its rung sets none: ``--gpus_per_run``, else ``--trainer.devices``, else 1."""
    given = a.gpus_per_run if getattr(a, "gpus_per_run", None) else option_value(fit_options, DEVICES_KEY)
    return int(given) if given is not None and str(given).isdigit() else 1


def variant_batch(recipe: str, overrides: dict[str, str], fit_options: list[str]) -> int | None:
    """A variant's batch size as its run resolves it: recipe, its config files, fit options, its values."""
    value = _config_value([recipe] + [v for k, v in overrides.items() if k == CONFIG_KEY], BATCH_KEY)
    for source in (lambda key: option_value(fit_options, key), overrides.get):  # a variant's value comes later: wins
        for key in (BATCH_KEY, "data.batch_size"):
            value = source(key) or value
    return int(value) if value is not None and str(value).isdigit() else None


def rung_gpus(ladder: dict | None) -> list[int | None]:
    """Each rung's own GPUs per run (None: the sweep's), for placement; empty without a ladder."""
    return [r.get(GPUS) for r in ladder["rungs"]] if ladder else []


def lr_check_values(lr: float) -> list[str]:
    return [repr(lr * f) for f in LR_CHECK_FACTORS]


# --- the sweep's side: options, plan, children, tags -------------------------------------------------------------

def add_options(p) -> None:
    """The ladder's options of ``cli.py sweep``."""
    p.add_argument("--ladder", metavar="RUNGS",
                   help="train every variant at each of these sizes: rungs separated by ';', each KEY=V[,KEY=V] "
                        "(keys without a dot are under model.init_args.arch; tokens=N sets the rung's budget, "
                        "gpus_per_run=K its GPUs per run), "
                        "smallest first, or a YAML file listing them; then `compare --scaling`")
    p.add_argument("--tokens_per_param", type=float, default=None, metavar="R",
                   help="with --ladder: each rung trains R tokens per non-embedding parameter of the baseline "
                        "(20 is Chinchilla's compute-optimal ratio)")
    p.add_argument("--ladder_lr", choices=LR_RULES, default="fixed",
                   help="with --ladder: 'fixed' runs the recipe's learning rate at every rung (the default until a "
                        "parametrization is chosen); 'transfer' needs a parametrization other than sp")
    p.add_argument("--ladder_lr_check", nargs="?", const="all", choices=LR_CHECK_SCOPES, default=None,
                   help="with --ladder: also run lr/2 and 2 lr at every rung on the first seed (not counted), for "
                        "every variant ('all', the default) or the baseline only ('baseline', a third of the "
                        "cost), so compare can say whether each rung's learning rate sits at an edge")
    p.add_argument("--ladder_warmup", type=float, default=0.1, metavar="F",
                   help="with --ladder: warm up over this fraction of each rung's steps (default 0.1); a "
                        "negative value keeps the recipe's warmup_steps at every rung")


def _check_options(a) -> None:
    if a.ladder is None:
        used = [name for name, on in (("--tokens_per_param", a.tokens_per_param is not None),
                                      ("--ladder_lr transfer", a.ladder_lr != "fixed"),
                                      ("--ladder_lr_check", a.ladder_lr_check is not None)) if on]
        if used:
            raise UserInputError(f"{used[0]} is read only with --ladder RUNGS; add --ladder or drop it")
        return
    if a.tokens_per_param is not None and not a.tokens_per_param > 0:
        raise UserInputError(f"--tokens_per_param must be positive (like 20), got {a.tokens_per_param}")
    if a.ladder_warmup >= 1:
        raise UserInputError(f"--ladder_warmup is a fraction of each rung's steps, below 1 (like 0.1); got "
                             f"{a.ladder_warmup}")
    if a.tune:
        raise UserInputError("--tune with --ladder is not supported: a ladder keeps one learning-rate rule per "
                             "rung (--ladder_lr, checked with --ladder_lr_check); tune at one size with a sweep "
                             "without --ladder first")


def _config_value(files: list[str], key: str):
    """The value of a dotted config ``key`` in the last of ``files`` that sets it (None if none does)."""
    found = None
    for name in files:
        try:
            node = yaml.safe_load(Path(name).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            found = node
    return found


def variant_lr(recipe: str, overrides: dict[str, str], fit_options: list[str]) -> float | None:
    """A variant's learning rate as its run resolves it: recipe, its config files, fit options, its values."""
    value = _config_value([recipe] + [v for k, v in overrides.items() if k == CONFIG_KEY], LR_KEY)
    for key in (LR_KEY, "model.lr"):
        value = option_value(fit_options, key) or overrides.get(key) or value
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def measure(args_by_rung: list[list[str]]) -> list[tuple[int, float, int]]:
    """(non-embedding parameters, training FLOPs per token, tokens per optimizer step) of the model each list
    of ``fit`` arguments builds, counted on the built model (nothing trains)."""
    from lit.cli import check_config
    from lit.compute import gpt_flops_per_token, non_embedding_parameters

    out = []
    for args in args_by_rung:
        cli = check_config(args + ["--trainer.logger=false"])
        model, data = cli.model, cli.datamodule
        inner = getattr(model, "model", None)
        block = getattr(data, "block_size", None) or getattr(data.hparams, "block_size", None)
        batch = getattr(data, "batch_size", None) or getattr(data.hparams, "batch_size", None)
        if inner is None or block is None or batch is None or not hasattr(inner, "block_size"):
            raise UserInputError("--ladder sizes language-model recipes (a GPT and a text datamodule with "
                                 "batch_size and block_size); this recipe builds something else")
        accumulate = int(getattr(cli.trainer, "accumulate_grad_batches", 1) or 1)
        out.append((int(non_embedding_parameters(inner)), float(gpt_flops_per_token(inner, int(block))),
                    int(batch) * int(block) * accumulate))
    return out


def in_fork(fn, *args):
    """``fn(*args)`` in a forked process, its JSON result returned here: the sweep's own process never computes
    with torch (it forks its runs, and a forked OpenMP pool is not safe). A user error there is raised here."""
    import contextlib
    import io
    import json
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, leave without running the parent's exit handlers
        os.close(read)
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):
                result = {"ok": fn(*args)}
        except UserInputError as exc:
            result = {"error": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - a failed check, reported as one line in the parent
            lines = [x for x in captured.getvalue().splitlines() if x.startswith("error:")]
            result = {"error": lines[-1].removeprefix("error:").strip() if lines else f"{type(exc).__name__}: {exc}"}
        with os.fdopen(write, "w") as pipe:
            json.dump(result, pipe)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    result = json.loads(text) if text else {"error": "the sizing process died"}
    if "error" in result:
        raise UserInputError(f"--ladder: {result['error']}")
    return result["ok"]


def plan(a, fit_options: list[str], recipe: str, variants: list, baseline, measure_fn=None) -> dict | None:
    """The protocol's ``ladder`` field (None without ``--ladder``): rungs sized from the baseline, the lr rule.

    ``measure_fn`` (default: ``measure`` in a forked process) turns each rung's fit arguments into sizes."""
    _check_options(a)
    if a.ladder is None:
        return None
    rungs = parse_ladder(a.ladder)
    for v in variants:
        clash = sorted(set(v.overrides) & {k for r in rungs for k in r.overrides})
        if clash:
            raise UserInputError(f"variant {v.label!r} sets {clash[0]}, which the ladder's rungs set; vary it "
                                 "through --ladder, or drop it from the variant")
    arch = _config_value([recipe] + [v for k, v in baseline.overrides.items() if k == CONFIG_KEY],
                         ARCH_PREFIX.rstrip(".")) or {}
    arch = dict(arch) if isinstance(arch, dict) else {}
    for prefix in (ARCH_PREFIX, "model.arch."):  # later ones win
        for name in (PARAMETRIZATION_KEY, "d_model"):
            given = option_value(fit_options, prefix + name) or baseline.overrides.get(prefix + name)
            if given:
                arch[name] = given
        arch[OPTIONS_KEY] = _options(arch.get(OPTIONS_KEY), fit_options, baseline.overrides, prefix + OPTIONS_KEY)
    lr_rule = check_lr_rule(a.ladder_lr, arch)
    base_args = [*([x for k, v in baseline.overrides.items() if k == CONFIG_KEY for x in ("--config", v)]),
                 *fit_options, *(f"--{k}={v}" for k, v in baseline.overrides.items() if k != CONFIG_KEY)]
    args_by_rung = [["--config", recipe, *base_args, *(f"--{k}={v}" for k, v in r.overrides.items())]
                    for r in rungs]
    measured = (measure_fn or (lambda x: in_fork(measure, x)))(args_by_rung)
    log_every = option_value(fit_options, "trainer.log_every_n_steps") or _config_value(
        [recipe], "trainer.log_every_n_steps") or DEFAULT_LOG_EVERY
    sized = size_rungs(rungs, [tuple(m) for m in measured], a.tokens_per_param, int(log_every))
    if a.ladder_warmup >= 0:
        for r in sized:
            r.overrides["model.init_args.warmup_steps"] = str(int(round(a.ladder_warmup * r.steps)))
    split_batches(sized, sweep_devices(a, fit_options),
                  {v.label: variant_batch(recipe, v.overrides, fit_options) for v in variants})
    lrs = {v.label: variant_lr(recipe, v.overrides, fit_options) for v in variants}
    if a.ladder_lr_check and any(lr is None for lr in lrs.values()):
        missing = next(label for label, lr in lrs.items() if lr is None)
        raise UserInputError(f"--ladder_lr_check: cannot find variant {missing!r}'s learning rate "
                             f"({LR_KEY}) in its recipe and overrides; set it there")
    checked = [] if a.ladder_lr_check is None else (
        [v.label for v in variants] if a.ladder_lr_check == "all" else [baseline.label])
    return {"rungs": [r.to_json() for r in sized], "tokens_per_param": a.tokens_per_param,
            "lr": a.ladder_lr, "lr_rule": lr_rule, "lr_check": checked,
            "warmup_fraction": a.ladder_warmup if a.ladder_warmup >= 0 else None,
            "variant_lr": lrs}


def expand(children: list, ladder: dict | None) -> list:
    """The sweep's children, once per rung (rungs outermost, smallest first: the small ones finish first), and
    with ``lr_check`` the two neighbouring learning rates at every rung on the first seed."""
    if ladder is None:
        return children
    from dataclasses import replace

    out = []
    for rung in ladder["rungs"]:
        prefix = f"rung{rung['index']}"
        for c in children:
            out.append(replace(c, key=f"{prefix}|{c.key}", overrides={**c.overrides, **rung["overrides"]},
                               rung=rung["index"]))
        if ladder["lr_check"]:
            firsts = [c for c in children if c.phase == "seed" and c.seed_index == 0
                      and c.variant in ladder["lr_check"]]
            for c in firsts:
                lr = ladder["variant_lr"][c.variant]
                for value in lr_check_values(lr):
                    out.append(replace(c, key=f"{prefix}|{c.variant}|{LR_CHECK_PHASE}|lr={value}",
                                       phase=LR_CHECK_PHASE, overrides={**c.overrides, **rung["overrides"],
                                                                        LR_KEY: value},
                                       rung=rung["index"], tune_value=value))
    return out


LR_CHECK_PHASE = "lr_check"  # the neighbouring learning rates of a rung: never counted as results


def rung_tags(manifest: dict, child) -> dict[str, str]:
    """The tags that place a child run on the ladder: its rung, the rung's size and planned budget."""
    ladder = manifest["protocol"].get("ladder")
    if ladder is None or getattr(child, "rung", None) is None:
        return {}
    from lit.sweep import protocol as P

    rung = ladder["rungs"][child.rung]
    tags = {P.RUNG: str(rung["index"]), P.RUNG_SIZE: rung["label"], P.RUNG_TOKENS: str(rung["tokens"]),
            P.RUNG_COMPUTE: f"{rung['compute']:.6g}"}
    if child.phase == LR_CHECK_PHASE:
        tags[P.LR_CHECK_VALUE] = str(child.tune_value)
    return tags
