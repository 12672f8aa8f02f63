"""How a sweep is written into MLflow: the contract between ``cli.py sweep`` and ``cli.py compare``.

``compare`` reads runs back from the tracking store alone (no private state), so a sweep launched as
a SLURM job array and one launched on a laptop are reported the same way. Everything it needs is here:

Parent run (one per sweep, in the sweep's experiment)
    tags     ``ROLE = "parent"``, ``SWEEP_ID``
    artifact ``PROTOCOL_FILE`` (JSON): ``{"sweep_id", "recipe", "variants": [{"label", "overrides"}],
             "baseline": label, "seeds": [int, ...], "metric", "mode": "min"|"max",
             "tune": null | {"key", "values", "steps", "seed", "reuse_seed_run", "rule"}, "fit_args": [...],
             "steps": int | null}``
    metrics  ``sweep/wall_s``, ``sweep/children_s``, ``sweep/parallel``, ``sweep/overhead_fraction``
             (written when a local sweep ends)

Child run (one per (variant, seed), plus the tuning runs); ``mlflow.parentRunId`` is the parent
    tags     ``ROLE = "child"``, ``SWEEP_ID``, ``VARIANT`` (label), ``SEED`` (the seed value),
             ``SEED_INDEX``, ``PHASE`` ("tune", "seed", or "shared" below), ``CHILD_KEY`` (unique within the sweep),
             ``TUNE_KEY`` and ``TUNE_VALUE`` (when tuning: the tuned key and this run's value),
             ``FINAL = "true"`` on the runs that count as the variant's seed runs (seed-phase runs, and a
             tuning run reused as seed 0 once its value was picked)
    params   the run's fully resolved config, flattened (``model.init_args.lr``, ...), as every run has
    metrics  what training logs: ``val/loss``, ``val/bpb`` (text), ``val/acc1`` (images), ``train/loss``,
             ``train/tokens_per_s`` or ``train/images_per_s``, ``model/parameters``, ``train/items_per_step``

A child run is done when it has an outcome (below); re-running the same sweep skips those.

Protocol fields added with divergence, held-out reporting and families (readers must accept their absence in
sweeps written before them, and then fall back to the old behaviour, saying so in the report):
    ``"family"``        the name of the multiple-comparison family this sweep's comparisons belong to (default:
                        the sweep id; ``--family NAME`` shares one across sweeps)
    ``"equivalence"``   null | ``{"margin": float, "variants": [label, ...]}``: the variants whose claim is parity,
                        tested by two one-sided tests within +-margin of the baseline
    ``"report_metric"`` the metric compare reports (``test/loss`` where the data have a test split), beside
                        ``"metric"``, the one tuning picks by (always a validation metric)
    ``"tune"``          gains ``"rule"``: ``"separate_seed"`` (tuning runs on ``"seed"``, outside the evaluation
                        seeds, never counted) or ``"reuse_seed_run"`` (the old rule, only when asked by name)
    ``"identity"``      what the sweep id covers: ``{"recipe_sha256", "variant_files": {path: sha256},
                        "commit", "dirty"}``
    ``"random_numbers"`` ``"by_name"`` (each run's init keyed by parameter name, dropout by module and batch:
                        ``lit/common_random_numbers.py``); absent in sweeps written before it, which drew them in
                        construction order (``--random_numbers construction_order`` keeps that rule and their ids)
Child tags added: ``OUTCOME`` (``"finished"`` or ``"diverged"``) and, on a diverged run, ``DIVERGED_STEP`` (the
first step whose loss was non-finite; the metrics up to the last finite step are kept). A diverged run ends with
MLflow status FAILED and ``OUTCOME = "diverged"``; any other FAILED run is a crash.

Written by the sweep beside those: ``"seed_base"`` (the first seed; ``--add_seeds`` appends seeds after the
last one, rewrites ``protocol.json`` and records the extension in ``extensions/extension_<j>.json``, below),
``"tune"."description"`` (the rule in words). A tuned variant whose tuning runs are all
``OUTCOME = "diverged"`` is diverged at every value: its seed runs are never created.
A child is done (never rerun) when it is FINISHED with ``OUTCOME = "finished"`` or FAILED with
``OUTCOME = "diverged"``; a FINISHED run without ``OUTCOME`` was stopped before its test and is marked
KILLED when the sweep resumes. Owner and heartbeat tags: ``lit/sweep/ownership.py``.

Ladder sweeps (``--ladder``) add the protocol field ``"ladder"``: ``{"rungs": [{"index", "label", "overrides",
"parameters", "flops_per_token", "tokens", "steps", "compute"}], "tokens_per_param", "lr": "fixed"|"transfer",
"lr_rule", "lr_check", "warmup_fraction", "variant_lr": {label: lr}}`` (parameters, FLOPs and compute: the
baseline's at that rung), and on every child run the tags ``RUNG`` (the rung's index, 0 the smallest),
``RUNG_SIZE`` (its keys as written), ``RUNG_TOKENS`` and ``RUNG_COMPUTE`` (the baseline's planned FLOPs; a run's
own FLOPs are its last ``train/flops``). Learning-rate check runs have ``PHASE = "lr_check"`` and
``LR_CHECK_VALUE``; they are never final.

Sequential sweeps (``--looks``) add the protocol field ``"sequential"`` (part of what identifies the sweep; absent,
not null, in a fixed sweep): ``{"looks": [n_1, ..., n_K], "alpha", "spending": "obrien_fleming"|"pocock",
"effect_of_interest": float | null, "futility_power", "multiplicity", "test", "futility"}`` (the last three the
rules in words; ``lit/statistics/sequential.py``, ``Plan``); ``"seeds"`` then lists the maximum, n_K seeds. The
sweep's course is a history under the parent run that is never rewritten (``lit/sweep/history.py``):
    ``looks/look_<k>.json``        one per look performed: ``{"look", "of", "seeds", "information_fraction", "alpha",
                                   "spending", "alpha_spent", "family_size", "first_step": {"share", "boundary_p",
                                   "critical_t"}, "comparisons": [{"label", "state": "open"|"rejected"|"futile"|
                                   "retained", "look", "pairs", "test", "p_values", "direction", "share",
                                   "boundary_look", "boundary_p", "critical_t", "conditional_power"}], "untestable",
                                   "open", "next_seeds", "recorded_at"}``
    ``extensions/extension_<j>.json``  one per ``--add_seeds`` outside a sequential plan: ``{"index", "from_seeds",
                                   "to_seeds", "meaning", "recorded_at"}``
A look's child runs are ordinary seed runs; a comparison settled at look k has runs of the first n_k seeds only.

Shared-value sweeps (``--shared_value``, only with ``--tune``) add the protocol field ``"shared_value": true`` (part
of what identifies the sweep; absent, not false, in a sweep without it, whose id stands). Each variant but the
baseline then also runs every evaluation seed at the *baseline's* picked tuning value, for a secondary comparison
at a shared learning rate (``lit/compare/shared_value.py``); the primary comparison stays the one at each variant's
own tuned value. Those children have ``PHASE = "shared"``, ``TUNE_VALUE`` the baseline's pick (looked up in the
store when the run starts, as a seed run's is), and ``SHARED_VALUE = "true"``; never ``FINAL``. A variant whose own
pick equals the baseline's trains nothing more: its seed run at that seed already is the run at the baseline's
value, and gets ``SHARED_VALUE = "true"`` beside its ``FINAL`` (and ``REUSED_AS``, the shared child's key, so a
resumed sweep counts that child done). compare counts as a variant's shared-value runs those tagged
``SHARED_VALUE`` (finished or diverged, the latest per seed), paired with the baseline's final runs.
A variant diverged at every tuning value has no shared-value run either.
"""

from __future__ import annotations

PREFIX = "arch_lab.sweep."
ROLE = PREFIX + "role"
SWEEP_ID = PREFIX + "id"
VARIANT = PREFIX + "variant"
SEED = PREFIX + "seed"
SEED_INDEX = PREFIX + "seed_index"
PHASE = PREFIX + "phase"
CHILD_KEY = PREFIX + "child"
TUNE_KEY = PREFIX + "tune_key"
TUNE_VALUE = PREFIX + "tune_value"
FINAL = PREFIX + "final"
OUTCOME = PREFIX + "outcome"
DIVERGED_STEP = PREFIX + "diverged_step"
RUNG = PREFIX + "rung"
RUNG_SIZE = PREFIX + "rung_size"
RUNG_TOKENS = PREFIX + "rung_tokens"
RUNG_COMPUTE = PREFIX + "rung_compute"
LR_CHECK_VALUE = PREFIX + "lr_check_value"
SHARED_VALUE = PREFIX + "shared_value"  # "true" on the runs that count as a variant's run at the baseline's value
REUSED_AS = PREFIX + "reused_as"  # on a seed run reused as a shared-value child: that child's key (it is done too)
PARENT_RUN = "mlflow.parentRunId"

PROTOCOL_FILE = "protocol.json"
REPORT_DIR = "report"  # the parent run's artifact folder for compare's Markdown and PNGs

PARAMETERS_METRIC = "model/parameters"
ITEMS_PER_STEP_METRIC = "train/items_per_step"
THROUGHPUT_METRICS = ("train/tokens_per_s", "train/images_per_s", "train/samples_per_s")
FLOPS_METRIC = "train/flops"  # training FLOPs spent so far, logged every step: its last value is the run's compute
FLOPS_PER_ITEM_METRICS = ("model/flops_per_token", "model/flops_per_image")


PARENT, CHILD = "parent", "child"  # values of ROLE
TUNE_PHASE, SEED_PHASE, SHARED_PHASE = "tune", "seed", "shared"  # values of PHASE
TRUE = "true"  # the value of FINAL
FINISHED_OUTCOME, DIVERGED_OUTCOME = "finished", "diverged"  # values of OUTCOME


def is_true(tag: str | None) -> bool:
    """Whether a flag tag is set. Runs logged before the logger typed its tags as strings got the config
    parser's reading of "true" (True, stored as "True" or "1"); those still count."""
    return tag in (TRUE, "True", "1")


# The one rule for a metric's direction, shared by sweep, compare and ladders: the last path segment, lower case,
# read as an exact name first, then by a lower-is-better suffix; anything else must be told (--mode). Prefixes
# are never read: "val/dice_loss" starts like a higher-is-better "dice" and is a loss.
LOWER_IS_BETTER = ("loss", "nll", "ppl", "perplexity", "bpb", "bpc", "bits", "error", "err", "mse", "mae", "rmse",
                   "cer", "wer", "mape")
HIGHER_IS_BETTER = ("acc", "acc1", "acc5", "accuracy", "top1", "top5", "f1", "auc", "auroc", "map", "iou", "miou",
                    "dice", "bleu", "rouge", "mcc", "r2", "precision", "recall", "psnr", "ssim")
LOWER_IS_BETTER_SUFFIXES = ("_loss", "_err", "_error")


def known_mode(metric: str) -> str | None:
    """``"min"`` or ``"max"`` as the metric's name says, or None for a name this rule does not know."""
    name = metric.rsplit("/", 1)[-1].lower()
    if name in LOWER_IS_BETTER:
        return "min"
    if name in HIGHER_IS_BETTER:
        return "max"
    if name.endswith(LOWER_IS_BETTER_SUFFIXES):
        return "min"
    return None
