"""``compare --scaling``'s report: the fitted laws, each variant's effective-compute multiplier per rung and at a
target compute with its interval, the wall-clock multiplier beside it, the trend with scale, the hold-out check,
the learning-rate check, the interval's calibration at this ladder's noise, and two figures.

The numbers come from ``lit/compare/scaling.py``; this file only arranges them (Markdown and PNG).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from lit.compare.ladder_runs import LadderSweep
from lit.compare.scaling import (
    Calibration,
    Laws,
    Multipliers,
    TrueLaw,
    _half_width,
    _seed_means,
    calibrate,
    fit_laws,
    holdout_check,
    multipliers,
)

LOSS_FIGURE, MULTIPLIER_FIGURE = "scaling_loss.png", "scaling_multiplier.png"
DPI = 120
PLAIN = FuncFormatter(lambda y, _: f"{y:.3g}")  # a log y axis labelled 2.1, not 2.1 x 10^0
EXTRAPOLATION_LIMIT = 10.0  # a target beyond 10x the largest rung is refused: the law was never checked there
INJECTED = 1.25  # the multiplier the calibration injects


@dataclass(frozen=True)
class ScalingAnalysis:
    sweep: LadderSweep
    pinned_E: float | None
    confidence: float
    resamples: int
    laws: Laws  # common exponent, E shared or pinned
    own_alpha: np.ndarray  # (V,) each variant's exponent at that E
    results: list[Multipliers]
    throughput_ratio: np.ndarray  # (V, R): variant FLOP/s over the baseline's
    holdout: tuple[np.ndarray, np.ndarray] | None  # (errors, half-widths) per variant, or None (< 4 rungs)
    calibration: tuple[TrueLaw, list[Calibration]] | None
    band: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # compute grid, law loss (V, G), half-width (V, G)


def analyze_scaling(sweep: LadderSweep, pinned_E: float | None, target: float | None, confidence: float,
                    resamples: int = 2000, calibration_ladders: int = 200, seed: int = 0) -> ScalingAnalysis:
    from lit.errors import UserInputError

    ladder = sweep.ladder
    n = ladder.loss.shape[-1]
    if n < 2:
        raise UserInputError("--scaling needs at least 2 paired seeds per run for an interval (3 or more to trust "
                             "it); rerun the sweep with --seeds 3")
    largest = float(np.nanmax(ladder.compute))
    if target is not None and target > EXTRAPOLATION_LIMIT * largest:
        raise UserInputError(f"--target_compute {target:.3g} is more than {EXTRAPOLATION_LIMIT:g}x the largest rung "
                             f"({largest:.3g} FLOPs); a law fitted on this ladder was never checked there: add "
                             "rungs, or ask for less")
    floor = float(np.nanmin(_seed_means(ladder.loss, None)))
    if pinned_E is not None and pinned_E >= floor:
        raise UserInputError(f"--irreducible {pinned_E} is not below every mean loss of the ladder (the lowest is "
                             f"{floor:.4f}); the law needs L - E > 0: pass a smaller value")
    mean = _seed_means(ladder.loss, None)
    log_c = np.log(ladder.compute)
    laws = fit_laws(log_c, mean, pinned_E, common_alpha=True)
    own = fit_laws(log_c, mean, laws.E).alpha
    results = multipliers(ladder, target, pinned_E, resamples, confidence, seed)
    ratio = sweep.flops_per_s / sweep.flops_per_s[:1]
    holdout = holdout_check(ladder, pinned_E, resamples, confidence, seed) if ladder.compute.shape[1] >= 4 else None
    calibration = None
    if calibration_ladders > 0:
        law = TrueLaw.from_ladder(ladder)
        calibration = (law, [calibrate(m, seeds=n, ladders=calibration_ladders, law=law, resamples=200,
                                       seed=seed, confidence=confidence) for m in (1.0, INJECTED)])
    band = _law_band(ladder, pinned_E, confidence, resamples, seed)
    return ScalingAnalysis(sweep, pinned_E, confidence, resamples, laws, own, results, ratio, holdout, calibration,
                           band)


def _law_band(ladder, pinned_E, confidence, resamples, seed):
    """Each variant's shared-exponent law on a compute grid, and the half-width of its band (t-corrected paired
    bootstrap, in log loss): what the loss figure draws."""
    n = ladder.loss.shape[-1]
    grid = np.geomspace(np.nanmin(ladder.compute) / 1.5, np.nanmax(ladder.compute) * 1.5, 60)
    log_c = np.log(ladder.compute)
    laws = fit_laws(log_c, _seed_means(ladder.loss, None), pinned_E, common_alpha=True)
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    boot = fit_laws(log_c, _seed_means(ladder.loss, draws), pinned_E, common_alpha=True)
    V = len(ladder.variants)
    curve = np.stack([laws.loss(grid, v) for v in range(V)])
    boot_curve = np.stack([boot.loss(grid, v) for v in range(V)], axis=1)  # (B, V, G)
    half = _half_width(np.log(boot_curve), n, confidence)
    return grid, curve, half


# --- Markdown ---------------------------------------------------------------------------------------------------

def _interval(value: float, lo: float, hi: float) -> str:
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def render_scaling(a: ScalingAnalysis, figures: list[str]) -> str:
    s, ladder, spec = a.sweep, a.sweep.ladder, a.sweep.protocol["ladder"]
    V, R, S = ladder.loss.shape
    level = f"{a.confidence:.0%}"
    lines = [f"# Scaling ladder: sweep {s.protocol.get('sweep_id', s.parent_id)}", "",
             f"Metric: final `{s.metric}` per run (lower is better); compute: each run's last `train/flops`. "
             f"{V} variants x {R} rungs x {S} paired seeds; baseline: `{ladder.variants[0]}`.", "",
             "## Rungs", "",
             "| rung | size | non-embedding parameters (baseline) | tokens | steps | baseline compute (FLOPs) |",
             "|---|---|---|---|---|---|"]
    for r in s.rungs:
        lines.append(f"| {r['index']} | {r['label']} | {r['parameters']:,} | {r['tokens']:,} | {r['steps']} | "
                     f"{ladder.compute[0, r['index']]:.3g} |")
    span = float(ladder.compute[0, -1] / ladder.compute[0, 0])
    tpp = spec.get("tokens_per_param")
    lines += ["", f"Span: {span:.1f}x compute. Tokens: "
              + (f"{tpp:g} per non-embedding parameter of the baseline" if tpp else "per rung, as given")
              + "; every variant trains on the same tokens at a rung. Learning rate: " + spec["lr_rule"] + "."]
    if spec.get("warmup_fraction") is not None:
        lines[-1] += f" Warm-up: the first {spec['warmup_fraction']:.0%} of each rung's steps."
    diverged = s.runs[s.runs.outcome == "diverged"]
    if len(diverged):
        lines += ["", f"**Diverged runs** ({len(diverged)}), missing from the fits (the variant's multiplier at "
                  "those rungs is then optimistic): "
                  + ", ".join(f"{row.variant} rung {row.rung} seed {row.seed_index}" for row in diverged.itertuples())]
    E_how = f"pinned by --irreducible at {a.pinned_E:g}" if a.pinned_E is not None else "fitted, shared by all variants"
    lines += ["", "## Fitted laws", "",
              f"L(C) = E + A_v C^-alpha with E = {float(a.laws.E):.4f} ({E_how}) and one exponent alpha = "
              f"{float(a.laws.alpha[0]):.4f} for all variants (the model of a constant multiplier); each variant's "
              "own exponent at that E beside it.", "",
              "| variant | A | own alpha | hold-out error at the largest rung |", "|---|---|---|---|"]
    for v, name in enumerate(ladder.variants):
        held = "n/a (needs 4 rungs)"
        if a.holdout is not None:
            err, half = a.holdout[0][v], a.holdout[1][v]
            inside = "inside" if abs(err) <= half else "**outside**"
            held = f"{err:+.4f} (+-{half:.4f} from seeds: {inside})"
        lines.append(f"| {name} | {float(a.laws.A[v]):.4g} | {float(a.own_alpha[v]):.4f} | {held} |")
    lines += ["", "Hold-out: the law fitted without the largest rung predicts its mean loss; the error is predicted "
              f"minus observed, with the {level} half-width of the prediction and the observed mean over seeds.",
              "", "## Effective-compute multipliers", "",
              "The compute the baseline needs to reach the variant's loss, divided by the variant's compute: above 1 "
              "the variant is worth more compute than it spends. Per rung it is read off the baseline's observed "
              "curve where the baseline's runs span the variant's loss (no law assumed), and off the baseline's law "
              f"beyond it (marked \\*). Intervals: {level}, paired bootstrap over seed indices ({a.resamples} "
              "resamples, the fit redone on each), t-corrected for the seed count.", ""]
    header = "| variant | " + " | ".join(f"rung {r}" for r in range(R)) + " |"
    lines += [header, "|---|" + "---|" * R]
    for m in a.results:
        cells = [_interval(m.per_rung[r], *m.per_rung_interval[r]) + ("\\*" if m.extrapolated[r] else "")
                 for r in range(R)]
        lines.append(f"| {m.variant} | " + " | ".join(cells) + " |")
    target = a.results[0].target_compute if a.results else float("nan")
    lines += ["", f"At the target compute {target:.3g} FLOPs, with the wall-clock multiplier (the multiplier times "
              "the variant's measured FLOP/s over the baseline's at the largest rung):", "",
              f"| variant | multiplier at target [{level}] | FLOP/s ratio | wall-clock multiplier | trend of log "
              "multiplier per log compute | depends on scale |", "|---|---|---|---|---|---|"]
    for v, m in enumerate(a.results, 1):
        ratio = float(a.throughput_ratio[v, -1])
        lo, hi = m.target_interval
        wall = _interval(m.at_target * ratio, lo * ratio, hi * ratio) if np.isfinite(ratio) else "n/a"
        trend = _interval(m.trend, *m.trend_interval)
        flag = "**yes**: read the trend, not one number" if m.depends_on_scale else "no"
        lines.append(f"| {m.variant} | {_interval(m.at_target, lo, hi)} | {ratio:.3f} | {wall} | {trend} | {flag} |")
    lines += ["", "The trend is the slope of log multiplier on log compute over the rungs (its interval from the same "
              "bootstrap); when it excludes 0 the exponents differ, the multiplier at the target comes from each "
              "variant's own exponent, and the gain changes with scale. The wall-clock interval treats the FLOP/s "
              "ratio as known (it is measured on this machine, under its load)."]
    if len(s.lr_check):
        lines += ["", "## Learning-rate check", "",
                  "Each checked variant at each rung on the first seed, at lr/2, lr and 2 lr (the final validation "
                  f"`{s.protocol.get('metric') or 'val/loss'}`, as tuning reads it): an edge means the "
                  "rung's learning rate is not the best of the three.", "",
                  "| variant | rung | " + " | ".join(["loss at lr/2", "at lr", "at 2 lr"]) + " | best |",
                  "|---|---|---|---|---|---|"]
        for (variant, rung), group in s.lr_check.groupby(["variant", "rung"]):
            group = group.sort_values("lr")
            losses = [f"{x:.4f}" for x in group.loss]
            best = group.lr.iloc[int(np.argmin(group.loss.to_numpy()))]
            own = (s.protocol["ladder"].get("variant_lr") or {}).get(variant)
            where = "lr (centre)" if own is not None and np.isclose(best, own) else f"{best:g} (**edge**)"
            lines.append(f"| {variant} | {rung} | " + " | ".join(losses) + f" | {where} |")
    if a.calibration is not None:
        law, cals = a.calibration
        lines += ["", "## Calibration at this ladder's noise", "",
                  f"Simulated ladders drawn from this ladder's baseline law (E {law.E:.3f}, A {law.A:.4g}, alpha "
                  f"{law.alpha:.3f}) at its compute, with its pooled seed standard deviation {law.noise_sd:.4f} and "
                  f"the correlation of paired runs {law.pair_correlation:.2f}, {S} seeds, estimated as above:", "",
                  "| true multiplier | ladders | coverage of the interval | median estimate | called scale-dependent |",
                  "|---|---|---|---|---|"]
        for c in cals:
            lines.append(f"| {c.multiplier:.2f} | {c.ladders} | {c.coverage:.1%} | {c.median_estimate:.3f} | "
                         f"{c.flagged:.1%} |")
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    return "\n".join(lines) + "\n"


# --- figures ----------------------------------------------------------------------------------------------------

def draw_scaling(a: ScalingAnalysis, out: Path) -> list[str]:
    """Loss against compute (log axes) with each variant's law and band; multiplier against compute."""
    ladder = a.sweep.ladder
    colors = [f"C{i % 10}" for i in range(len(ladder.variants))]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    grid, curve, half = a.band
    for v, name in enumerate(ladder.variants):
        c = np.broadcast_to(ladder.compute[v][:, None], ladder.loss[v].shape)
        ax.scatter(c.ravel(), ladder.loss[v].ravel(), s=8, alpha=0.35, color=colors[v])
        ax.plot(ladder.compute[v], np.nanmean(ladder.loss[v], -1), "o", color=colors[v], ms=5)
        ax.plot(grid, curve[v], "-", color=colors[v], lw=1.2, label=name)
        ax.fill_between(grid, curve[v] * np.exp(-half[v]), curve[v] * np.exp(half[v]), color=colors[v], alpha=0.15)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(PLAIN)
    ax.set_xlabel("training compute (FLOPs)")
    ax.set_ylabel(a.sweep.metric)
    ax.set_title(f"L = E + A C^-alpha, E = {float(a.laws.E):.3f}; bands: {a.confidence:.0%}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / LOSS_FIGURE, dpi=DPI)

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for v, m in enumerate(a.results, 1):
        lo, hi = m.per_rung_interval[:, 0], m.per_rung_interval[:, 1]
        ax.errorbar(ladder.compute[v], m.per_rung, yerr=[m.per_rung - lo, hi - m.per_rung], fmt="o-", ms=4,
                    capsize=3, color=colors[v], label=m.variant + (" (depends on scale)" if m.depends_on_scale else ""))
        tlo, thi = m.target_interval
        ax.errorbar([m.target_compute * 1.08], [m.at_target], yerr=[[m.at_target - tlo], [thi - m.at_target]],
                    fmt="s", ms=6, mfc="none", capsize=4, color=colors[v])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(PLAIN)
    ax.set_xlabel("training compute (FLOPs)")
    ax.set_ylabel("effective-compute multiplier vs " + ladder.variants[0])
    ax.set_title(f"per rung (circles) and at the target (squares), {a.confidence:.0%} intervals")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / MULTIPLIER_FIGURE, dpi=DPI)
    return [LOSS_FIGURE, MULTIPLIER_FIGURE]
