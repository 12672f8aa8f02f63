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
    mean = _seed_means(ladder.counted_loss, None)  # failed cells missing (scaling.py, "Failures")
    floor = float(np.nanmin(mean))
    if pinned_E is not None and pinned_E >= floor:
        raise UserInputError(f"--irreducible {pinned_E} is not below every mean loss of the ladder (the lowest is "
                             f"{floor:.4f}); the law needs L - E > 0: pass a smaller value")
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
    loss = ladder.counted_loss
    laws = fit_laws(log_c, _seed_means(loss, None), pinned_E, common_alpha=True)
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    boot = fit_laws(log_c, _seed_means(loss, draws), pinned_E, common_alpha=True)
    V = len(ladder.variants)
    curve = np.stack([laws.loss(grid, v) for v in range(V)])
    boot_curve = np.stack([boot.loss(grid, v) for v in range(V)], axis=1)  # (B, V, G)
    half = _half_width(np.log(boot_curve), n, confidence)
    return grid, curve, half


# --- the report's own checks ------------------------------------------------------------------------------------

# All hold-out errors of one sign fail the law from this many variants on: were the errors independent and
# symmetric, one sign would come up with probability 2^(1-V), 1/8 at 4 variants.
SAME_SIGN_VARIANTS = 4
E_EDGE = 1e-3  # E within this fraction of its range [0, lowest mean loss) from an end sits at that bound


def e_position(E: float, floor: float, pinned: bool) -> str:
    """Where the shared E sits against its bounds [0, lowest mean loss), in one sentence."""
    if pinned:
        return (f"E is pinned at {E:g} (--irreducible), not fitted: the law and every multiplier read off it are "
                "conditional on that value.")
    if E <= E_EDGE * floor:
        return (f"E = {E:.4f} sits at its lower bound 0: the fit is not identified there (the data ask for E < 0 "
                "or another form of law), so A and the exponent are read at a boundary.")
    if E >= (1 - E_EDGE) * floor:
        return (f"E = {E:.4f} sits at its upper bound, the lowest mean loss {floor:.4f}: the fit is not identified "
                "there (the law flattens into the data).")
    return f"E = {E:.4f} lies inside its bounds [0, {floor:.4f}) (the lowest mean loss), away from both."


def holdout_pattern(errors: np.ndarray, half: np.ndarray, variants: tuple[str, ...]) -> tuple[bool, str]:
    """Whether the law fails its hold-out, and the sentence that says why: an error outside its seed interval,
    or every error of one sign across at least ``SAME_SIGN_VARIANTS`` variants (a shared bias, not seed noise).
    Variants without an error (failed at the largest rung) are left out and named."""
    ok = np.isfinite(errors)
    n, pos, neg = int(ok.sum()), int((errors[ok] > 0).sum()), int((errors[ok] < 0).sum())
    outside = [variants[v] for v in np.flatnonzero(ok) if abs(errors[v]) > half[v]]
    missing = [variants[v] for v in np.flatnonzero(~ok)]
    parts, fails = [], bool(outside)
    if n and (pos == n or neg == n):
        sign, way = ("positive", "higher") if pos == n else ("negative", "lower")
        misspecified = n >= SAME_SIGN_VARIANTS
        fails |= misspecified
        parts.append(f"all {n} hold-out errors {sign} (the law predicts a {way} loss than observed at the largest "
                     "rung for every variant): " + ("the law is misspecified, a shared bias rather than seed noise"
                                                    if misspecified else f"with {n} variants this may be chance"))
    elif n:
        parts.append(f"hold-out errors of both signs ({pos} positive, {neg} negative): no shared bias")
    parts.append(f"{len(outside)} of {n} outside its seed interval" + (f" ({', '.join(outside)})" if outside else ""))
    if missing:
        parts.append(f"none for {', '.join(missing)} (diverged at the largest rung)")
    return fails, "; ".join(parts) + "."


def lr_checks(sweep: LadderSweep) -> list[str]:
    """Whether every variant's learning rate was checked, and where a checked one sits at its grid's edge."""
    variants = sweep.ladder.variants
    own = sweep.protocol["ladder"].get("variant_lr") or {}
    R = sweep.ladder.compute.shape[1]
    checked = [v for v in variants if v in set(sweep.lr_check.variant)]
    unchecked = [v for v in variants if v not in checked]
    if not checked:
        return ["No variant's learning rate was checked (the ladder ran without --ladder_lr_check): every "
                "multiplier includes each variant's distance from its own optimum, unmeasured."]
    lines = ["Every variant's learning rate was checked." if not unchecked else
             f"Learning rate checked for {', '.join(checked)} only; **not checked: {', '.join(unchecked)}** (their "
             "multipliers include their distance from their own optimum, unmeasured; --ladder_lr_check all checks "
             "every variant)."]
    for variant in checked:
        edges, incomplete = [], []
        for r in range(R):
            group = sweep.lr_check[(sweep.lr_check.variant == variant) & (sweep.lr_check.rung == r)]
            lr = own.get(variant)
            if lr is None or len(group) < 3 or not np.isclose(group.lr, lr).any():
                incomplete.append(r)
                continue
            best = float(group.lr.iloc[int(np.argmin(group.loss.to_numpy()))])
            if not np.isclose(best, lr):
                edges.append(f"{r} ({'2 lr' if best > lr else 'lr/2'} better)")
        where = (f"at its grid's **edge** at rung(s) {', '.join(edges)}: the check does not bracket its optimum "
                 "there, so its multiplier is read at a learning rate off its optimum" if edges
                 else "at the centre of its check at every checked rung")
        lines.append(f"{variant}'s learning rate is {where}"
                     + (f"; the check is incomplete at rung(s) {', '.join(map(str, incomplete))}" if incomplete
                        else "") + ".")
    return lines


def failures(a: ScalingAnalysis) -> list[str]:
    """One sentence per variant that failed at some rung (a seed diverged)."""
    ladder = a.sweep.ladder
    S = ladder.loss.shape[-1]
    lines = []
    for v, m in enumerate(a.results, 1):
        if m.estimable:
            continue
        where = ", ".join(f"rung {r} ({int(ladder.diverged[v, r])} of {S} seeds)" for r in np.flatnonzero(m.failed))
        lines.append(f"**{m.variant} diverged** at {where}: a failure there, not averaged over its survivors; its "
                     "multiplier there is an upper bound (<=, the survivors' value), and its multiplier at the target "
                     "and its trend are not estimable.")
    return lines


@dataclass(frozen=True)
class Verdict:
    """Whether the law held out of sample, and the checks' sentences. When it did not (or could not be checked),
    the law is a local description and the per-rung multipliers lead the report: one rule, here."""

    law_holds: bool
    headline: str
    checks: list[str]


def verdict(a: ScalingAnalysis) -> Verdict:
    ladder = a.sweep.ladder
    floor = float(np.nanmin(_seed_means(ladder.counted_loss, None)))
    checks = [e_position(float(a.laws.E), floor, a.pinned_E is not None)]
    if a.holdout is None:
        holds = False
        checks.append("Hold-out: not checked (it needs 4 rungs: 3 to fit, 1 to predict).")
        why = "is not checked out of sample (a hold-out needs 4 rungs)"
    else:
        fails, sentence = holdout_pattern(*a.holdout, ladder.variants)
        holds = not fails
        checks.append("Hold-out: " + sentence)
        why = "fails its hold-out"
    checks += lr_checks(a.sweep) + failures(a)
    if holds:
        headline = ("The law passes its hold-out: the multipliers at the target compute are read from it, and the "
                    "per-rung multipliers follow.")
    else:
        headline = (f"**The law {why}: it is a local description of this range, not a law to extrapolate.** The "
                    "per-rung multipliers lead (unmarked ones are read off the baseline's observed runs, with no "
                    "law); the multiplier at the target compute is conditional on the law.")
    return Verdict(holds, headline, checks)


# --- Markdown ---------------------------------------------------------------------------------------------------

def _interval(value: float, lo: float, hi: float) -> str:
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def _rung_cell(a: ScalingAnalysis, m: Multipliers, v: int, r: int) -> str:
    if m.failed[r]:
        S = a.sweep.ladder.loss.shape[-1]
        seeds = f"diverged {int(a.sweep.ladder.diverged[v, r])}/{S}"
        return f"<= {m.upper_bound[r]:.3f} ({seeds})" if np.isfinite(m.upper_bound[r]) else f"({seeds})"
    return _interval(m.per_rung[r], *m.per_rung_interval[r]) + ("\\*" if m.extrapolated[r] else "")


def render_scaling(a: ScalingAnalysis, figures: list[str]) -> str:
    s, ladder, spec = a.sweep, a.sweep.ladder, a.sweep.protocol["ladder"]
    V, R, S = ladder.loss.shape
    level = f"{a.confidence:.0%}"
    judged = verdict(a)
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
    lines += ["", "## Checks", "", judged.headline, ""] + [f"- {c}" for c in judged.checks]
    diverged = s.runs[s.runs.outcome == "diverged"]
    if len(diverged):
        lines += ["", f"Diverged runs ({len(diverged)}): "
                  + ", ".join(f"{row.variant} rung {row.rung} seed {row.seed_index}" for row in diverged.itertuples())
                  + ". A rung where any seed of a variant diverged is a failure of that variant: it is missing from "
                  "every fit, and never averaged over the survivors (that would bias the multiplier upward)."]

    E_how = f"pinned by --irreducible at {a.pinned_E:g}" if a.pinned_E is not None else "fitted, shared by all variants"
    law = ["", "## Fitted laws" + ("" if judged.law_holds else " (a local description)"), "",
           f"L(C) = E + A_v C^-alpha with E = {float(a.laws.E):.4f} ({E_how}) and one exponent alpha = "
           f"{float(a.laws.alpha[0]):.4f} for all variants (the model of a constant multiplier); each variant's "
           "own exponent at that E beside it.", "",
           "| variant | A | own alpha | hold-out error at the largest rung |", "|---|---|---|---|"]
    for v, name in enumerate(ladder.variants):
        held = "n/a (needs 4 rungs)"
        if a.holdout is not None:
            err, half = a.holdout[0][v], a.holdout[1][v]
            inside = "inside" if abs(err) <= half else "**outside**"
            held = (f"{err:+.4f} (+-{half:.4f} from seeds: {inside})" if np.isfinite(err)
                    else "n/a (diverged at the largest rung)")
        law.append(f"| {name} | {float(a.laws.A[v]):.4g} | {float(a.own_alpha[v]):.4f} | {held} |")
    law += ["", "Hold-out: the law fitted without the largest rung predicts its mean loss; the error is predicted "
            f"minus observed, with the {level} half-width of the prediction and the observed mean over seeds."]

    per_rung = ["", "## Multipliers per rung", "",
                "The compute the baseline needs to reach the variant's loss, divided by the variant's compute: above 1 "
                "the variant is worth more compute than it spends. Per rung it is read off the baseline's observed "
                "curve where the baseline's runs span the variant's loss (no law assumed), and off the baseline's law "
                f"beyond it (marked \\*). Intervals: {level}, paired bootstrap over seed indices ({a.resamples} "
                "resamples, the fit redone on each), t-corrected for the seed count. At a rung where a seed diverged, "
                "<= x: an upper bound, the survivors' value.", ""]
    per_rung += ["| variant | " + " | ".join(f"rung {r}" for r in range(R)) + " |", "|---|" + "---|" * R]
    for v, m in enumerate(a.results, 1):
        per_rung.append(f"| {m.variant} | " + " | ".join(_rung_cell(a, m, v, r) for r in range(R)) + " |")

    target = a.results[0].target_compute if a.results else float("nan")
    at_target = ["", "## Multiplier at the target compute" + ("" if judged.law_holds else " (conditional on the law)"),
                 "", f"At the target compute {target:.3g} FLOPs, with the wall-clock multiplier (the multiplier times "
                 "the variant's measured FLOP/s over the baseline's at the largest rung):", "",
                 f"| variant | multiplier at target [{level}] | FLOP/s ratio | wall-clock multiplier | trend of log "
                 "multiplier per log compute | depends on scale |", "|---|---|---|---|---|---|"]
    for v, m in enumerate(a.results, 1):
        ratio = float(a.throughput_ratio[v, -1])
        if not m.estimable:
            why = "not estimable (diverged at rung " + ", ".join(map(str, np.flatnonzero(m.failed))) + ")"
            at_target.append(f"| {m.variant} | {why} | {ratio:.3f} | n/a | n/a | n/a |")
            continue
        lo, hi = m.target_interval
        wall = _interval(m.at_target * ratio, lo * ratio, hi * ratio) if np.isfinite(ratio) else "n/a"
        trend = _interval(m.trend, *m.trend_interval)
        flag = "**yes**: read the trend, not one number" if m.depends_on_scale else "no"
        at_target.append(f"| {m.variant} | {_interval(m.at_target, lo, hi)} | {ratio:.3f} | {wall} | {trend} | "
                         f"{flag} |")
    at_target += ["", "The trend is the slope of log multiplier on log compute over the rungs (its interval from the "
                  "same bootstrap); when it excludes 0 the exponents differ, the multiplier at the target comes from "
                  "each variant's own exponent, and the gain changes with scale. The wall-clock interval treats the "
                  "FLOP/s ratio as known (it is measured on this machine, under its load)."]
    lines += (law + per_rung + at_target) if judged.law_holds else (per_rung + law + at_target)

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
                  f"the correlation of paired runs {law.pair_correlation:.2f}, {S} seeds, estimated as above (seed "
                  "noise only: it says nothing of a misspecified law):", "",
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
        ax.plot(ladder.compute[v], _seed_means(ladder.counted_loss[v], None), "o", color=colors[v], ms=5)
        failed = ladder.failed[v]  # a failure: its survivors are drawn, but no mean (x at the rung's worst seed)
        worst = np.array([max(row[np.isfinite(row)], default=np.nan) for row in ladder.loss[v]])
        if failed.any():
            ax.plot(ladder.compute[v][failed], worst[failed], "x", color=colors[v], ms=8)
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
        if m.failed.any():  # the upper bounds at the failed rungs
            ax.plot(ladder.compute[v][m.failed], m.upper_bound[m.failed], "v", ms=6, color=colors[v])
        if not m.estimable:
            continue
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
