"""A ladder sweep read back from MLflow: one final loss per (variant, rung, seed), each run's own compute and
throughput, and the learning-rate check runs. Like ``runs.py``, nothing but the tracking store is read.

A run's compute is its last ``train/flops`` (the sweep rounds each rung's steps to whole logging intervals, so the
last logged value is the total); a variant's compute at a rung is the median over its seeds (they are equal).
Its throughput in FLOP/s is ``train/tokens_per_s`` (median of its logged values) times ``model/flops_per_token``.
A diverged run has no final loss, and is never dropped: it makes its (variant, rung) a failure (``Ladder.diverged``
counts them), which takes that cell out of every fit and leaves the variant's multiplier there an upper bound
(``lit/compare/scaling.py``, "Failures"); the report flags it per variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from lit.compare.analysis import metric_direction
from lit.compare.runs import DEFAULT_METRIC, is_diverged, read_protocol
from lit.compare.scaling import Ladder
from lit.errors import UserInputError
from lit.sweep import protocol as P
from lit.sweep.store import search_all_runs

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

LR_CHECK_PHASE = "lr_check"  # lit/sweep/ladder.py's phase of the neighbouring learning rates
RUN_COLUMNS = ("run_id", "variant", "rung", "seed_index", "outcome", "loss", "check_loss", "flops", "flops_per_s",
               "start_time")


@dataclass(frozen=True)
class LadderSweep:
    """What ``compare --scaling`` knows about a ladder sweep."""

    parent_id: str
    protocol: dict[str, Any]
    metric: str
    ladder: Ladder  # baseline first
    runs: pd.DataFrame  # one row per counted run (RUN_COLUMNS)
    flops_per_s: np.ndarray  # (V, R): median over seeds of each variant's FLOP/s at each rung
    lr_check: pd.DataFrame  # variant, rung, lr, loss (validation): the check runs and the seed-0 run at the rung's lr

    @property
    def rungs(self) -> list[dict]:
        return self.protocol["ladder"]["rungs"]


def _metric_median(client: MlflowClient, run: Run, key: str) -> float:
    values = [m.value for m in client.get_metric_history(run.info.run_id, key)]
    return float(np.median(values)) if values else float("nan")


def load_ladder(client: MlflowClient, parent: Run, metric: str | None = None,
                baseline: str | None = None, mode: str | None = None) -> LadderSweep:
    """The ladder of ``parent``'s sweep; ``UserInputError`` when it is not a ladder or cannot be fitted."""
    spec = read_protocol(client, parent)
    ladder_spec = spec.get("ladder")
    sweep = parent.info.run_id
    if not ladder_spec:
        raise UserInputError(f"sweep {sweep} is not a ladder sweep (its protocol has no rungs); run one with "
                             "`cli.py sweep --ladder RUNGS`, or compare this sweep without --scaling")
    rungs = ladder_spec["rungs"]
    if len(rungs) < 3:
        raise UserInputError(f"ladder sweep {sweep} has {len(rungs)} rungs; a scaling law needs at least 3")
    if spec.get("mode") == "max" and metric is None:
        raise UserInputError(f"sweep {sweep} reports {spec.get('metric')!r}, which goes up; --scaling fits a loss "
                             "(lower is better): pass --metric val/loss or test/loss")
    metric = metric or spec.get("report_metric") or spec.get("metric") or DEFAULT_METRIC
    if metric_direction(spec, metric, mode)[0] == "max":
        raise UserInputError(f"--metric {metric} goes up; --scaling fits a loss (lower is better), like val/loss")
    labels = [v["label"] for v in spec.get("variants", [])]
    base = baseline or spec.get("baseline") or labels[0]
    if base not in labels:
        raise UserInputError(f"--baseline {base}: not a variant of this sweep; pass one of {', '.join(labels)}")
    variants = [base] + [label for label in labels if label != base]
    # The learning-rate check compares validation values (check runs are not tested), as tuning does.
    check_metric = spec.get("metric") or DEFAULT_METRIC
    children = search_all_runs(client, parent.info.experiment_id, f"tags.`{P.PARENT_RUN}` = '{sweep}'")
    rows, checks = [], []
    for run in sorted(children, key=lambda r: r.info.start_time or 0):  # oldest first: the newest wins below
        tags, metrics = run.data.tags, run.data.metrics
        if tags.get(P.RUNG) is None or tags.get(P.VARIANT) not in variants:
            continue
        rung = int(tags[P.RUNG])
        if tags.get(P.PHASE) == LR_CHECK_PHASE:
            if run.info.status == "FINISHED" and check_metric in metrics:
                checks.append((tags[P.VARIANT], rung, float(tags.get(P.LR_CHECK_VALUE, "nan")),
                               metrics[check_metric]))
            continue
        if not P.is_true(tags.get(P.FINAL)) or not (run.info.status == "FINISHED" or is_diverged(run)):
            continue
        diverged = is_diverged(run)
        rows.append((run.info.run_id, tags[P.VARIANT], rung, int(tags.get(P.SEED_INDEX, 0)),
                     P.DIVERGED_OUTCOME if diverged else P.FINISHED_OUTCOME,
                     float("nan") if diverged else metrics.get(metric, float("nan")),
                     float("nan") if diverged else metrics.get(check_metric, float("nan")),
                     metrics.get(P.FLOPS_METRIC, float("nan")),
                     float("nan") if diverged else _flops_per_s(client, run), run.info.start_time or 0))
    runs = pd.DataFrame(rows, columns=list(RUN_COLUMNS)).drop_duplicates(["variant", "rung", "seed_index"],
                                                                          keep="last")
    finished = runs[runs.outcome == P.FINISHED_OUTCOME]
    if finished.empty or finished.loss.isna().all():
        raise UserInputError(f"ladder sweep {sweep} has no finished run that logged {metric!r}; let it finish, or "
                             "pass --metric with one its runs logged (val/loss)")
    V, R = len(variants), len(rungs)
    S = int(runs.seed_index.max()) + 1
    loss = np.full((V, R, S), np.nan)
    compute = np.full((V, R), np.nan)
    speed = np.full((V, R), np.nan)
    diverged = np.zeros((V, R), dtype=int)
    for (variant, rung), group in runs.groupby(["variant", "rung"]):
        v = variants.index(variant)
        loss[v, rung, group.seed_index.to_numpy()] = group.loss.to_numpy()
        diverged[v, rung] = int((group.outcome == P.DIVERGED_OUTCOME).sum())
        done = group[group.outcome == P.FINISHED_OUTCOME]  # a diverged run stopped early: its FLOPs are not the rung's
        if done.flops.notna().any():
            compute[v, rung] = np.nanmedian(done.flops.to_numpy())
        elif diverged[v, rung]:  # every seed diverged: the rung's planned compute, for the figure's x axis only
            compute[v, rung] = float(rungs[rung].get("compute", np.nan))
        speed[v, rung] = np.nanmedian(done.flops_per_s) if done.flops_per_s.notna().any() else np.nan
    empty = [(variants[v], rungs[r]["label"]) for v in range(V) for r in range(R)
             if np.isnan(compute[v, r]) or (np.isnan(loss[v, r]).all() and not diverged[v, r])]
    if empty:
        variant, rung = empty[0]
        raise UserInputError(f"ladder sweep {sweep}: variant {variant!r} has no finished run with {metric!r} and "
                             f"train/flops at rung {rung} ({len(empty)} such cells); rerun the sweep command to "
                             "finish it")
    lr_check = _lr_check_table(checks, runs, spec)
    if diverged[0].any():
        failed = ", ".join(f"rung {r} ({diverged[0, r]} of {S} seeds)" for r in np.flatnonzero(diverged[0]))
        clean = [variants[v] for v in range(1, V) if not diverged[v].any()]
        raise UserInputError(f"ladder sweep {sweep}: the baseline {base!r} diverged at {failed}; it is every "
                             "multiplier's yardstick, so none is estimable against it: "
                             + (f"pass --baseline {clean[0]}" if clean else "rerun the ladder at a lower lr"))
    return LadderSweep(sweep, spec, metric, Ladder(tuple(variants), compute, loss, diverged),
                       runs.reset_index(drop=True), speed, lr_check)


def _flops_per_s(client: MlflowClient, run: Run) -> float:
    per_token = run.data.metrics.get("model/flops_per_token")
    if per_token is None:
        return float("nan")
    return _metric_median(client, run, "train/tokens_per_s") * per_token


def _lr_check_table(checks: list[tuple], runs: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """The three-point learning-rate check per (variant, rung): the check runs, and the first seed's run at the
    rung's own learning rate (the same seed, so the three differ only in the learning rate)."""
    rows = list(checks)
    own = spec["ladder"].get("variant_lr") or {}
    for variant, rung in {(v, r) for v, r, _, _ in checks}:
        first = runs[(runs.variant == variant) & (runs.rung == rung) & (runs.seed_index == 0)]
        if len(first) and own.get(variant) is not None:
            rows.append((variant, rung, float(own[variant]), float(first.check_loss.iloc[-1])))
    table = pd.DataFrame(rows, columns=["variant", "rung", "lr", "loss"])
    return table.drop_duplicates(["variant", "rung", "lr"], keep="last").sort_values(["variant", "rung", "lr"])
