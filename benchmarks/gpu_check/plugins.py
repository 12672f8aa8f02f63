"""Stage D: every registered plugin's step time over the baseline's at 124M width, eager and compiled per block.

The baseline is ours at 124M width (d 768, 12 layers, 12 heads, T 1024, B 8): rmsnorm, add, linear, sp, AdamW. Each
variant changes one thing: every name the registry lists for every kind (read from the registry, so a plugin
installed later is measured too), the attention options (clipped softmax, QK-norm with a logit soft-cap, gated
attention) and the nGPT recipe (hypersphere norm and nGPT residual together, renormalised after each step as its
callback does).

Each variant has two rows, one model: eager against the eager baseline, then the same model compiled per block
(``lit.parallel.compile_model(per_block=True)``, each block a graph: stage C measured it at 2.1 s and 0.98 of the
plain model at 124M) against the baseline compiled the same way. A pairing warms the variant up (its first step,
the compile, timed apart; host and device time per step, so whether it is host-bound; its peak memory above what
was resident before it was built), runs one baseline step untimed (the allocator re-grows what the variant
displaced, outside any window), then alternates windows of variant and baseline, the order flipped each round; each
round gives one ratio, so drift cancels (``ratios``: the median, a t interval, the target and the verdict). Steps
per window and rounds come from ``budget.plan_pairings``: at least 10 steps and 5 rounds where a ratio is under
1.5x, 3 rounds elsewhere, or what the stage's time allows, printed with what it cut. Per row also the FLOPs per
token over the baseline's (``lit.compute``, the model's FLOPs: an optimizer's are not counted) and the peak memory
over the baseline's. Where a compiled target is missed, a short profile names the kernels the variant spends the
most device time on beyond the baseline's (``costliest_ops``). Muon's AdamW half is fused where the baseline's
AdamW is, so its row compares optimizers, not AdamW implementations. Two baselines (eager and compiled) and one
variant are alive at a time.

Then the optimizer step alone, Muon against AdamW: host wall time and device time.
"""

from __future__ import annotations

import statistics
import time

import torch

from arch_plugins import registry
from benchmarks.gpu_check import costliest_ops, measure, ratios
from benchmarks.gpu_check.budget import CLOSE_RATIO, SKIPPED, PairingCosts, PairingPlan, plan_pairings, replan
from benchmarks.gpu_check.models import Shape, build_ours, fixed_batch, is_fused, loss_of, training_step
from lit.compute import gpt_flops_per_token
from lit.models import TransformerConfig

BASELINE = {"norm": "rmsnorm", "residual": "add", "projection": "linear", "parametrization": "sp",
            "optimizer": "adamw"}
OPTIONS = {"clipped softmax": {"clipped_softmax_gamma": -0.03},
           "qk_norm + logit soft-cap": {"qk_norm": "rmsnorm", "logit_softcap": 30.0},
           "gated attention": {"gated_attention": True}}
ARCH_FIELDS = set(TransformerConfig.__dataclass_fields__)
# The dry run measures one variant of each kind, an option and the recipe eager, and two compiled (a norm's new
# graph; Muon, whose blocks are the baseline's); a name the registry no longer has falls back to the kind's first.
# A slow test sets EVERY_VARIANT_IN_DRY: the whole registry, both rows.
DRY_EAGER = ("norm=dyt", "residual=laurel_rw", "projection=pattention", "parametrization=mup", "optimizer=muon",
             "clipped softmax", "recipe=gpt_ngpt")
DRY_COMPILED = ("norm=dyt", "optimizer=muon")
EVERY_VARIANT_IN_DRY = False
NOT_IN_DRY = {"status": "not run in --dry (a sample is)"}
NOT_REACHED = {"status": "not reached (the run ended first)"}
# The order D measures in: the review's plugins by their first eager excess on the H200, largest first (what a short
# budget should reach first, and the costliest early, so that the re-plan learns their cost), then the rest in the
# registry's order.
MEASURE_FIRST = ("residual=mhc", "residual=attnres", "residual=hyperconn", "clipped softmax", "optimizer=muon",
                 "residual=attnres_block", "residual=hyperconn_static", "norm=un", "recipe=gpt_ngpt",
                 "projection=pattention", "norm=hypersphere", "norm=powernorm", "norm=prepbn",
                 "residual=laurel_rw_lr_pa", "norm=seednorm", "qk_norm + logit soft-cap", "norm=precrmsnorm",
                 "norm=ssnorm", "norm=perinorm", "norm=3pt")
PROFILE_STEPS = 2  # steps profiled of a variant whose compiled target is missed (and of the baseline, once)
# Columns every measured row has (values may be None where a CPU cannot measure them: memory, host-bound).
COLUMNS = ("step_ratio", "ratio_ci", "rounds", "steps_per_window", "target", "verdict", "flops_ratio",
           "peak_allocated_gib", "memory_ratio", "host_issue_s", "device_step_s", "host_bound", "first_step_s")


def shape(dry: bool) -> Shape:
    # 3PT needs d_model % 6 == 0 and heads % 3 == 0 (768 and 12 at 124M width).
    return Shape(48, 2, 3, 16, 64, 2) if dry else Shape(768, 12, 12, 1024, 50304, 8)


def ngpt_recipe(s: Shape) -> dict:
    """recipes/gpt_ngpt.yaml's architecture at this width (benchmarks.kernels scales recipes the same way)."""
    from types import SimpleNamespace

    from benchmarks.kernels import recipe_arch

    arch = recipe_arch("gpt_ngpt", SimpleNamespace(d_model=s.d_model, layers=s.n_layers, heads=s.n_heads))
    return {k: v for k, v in arch.items() if k not in ("d_model", "n_layers", "n_heads")}


def variants(s: Shape) -> dict[str, dict]:
    """label -> {"arch": overrides, "optimizer": name} (or {"status": why not measured})."""
    out: dict[str, dict] = {}
    for kind in registry.kinds():
        for name in registry.names(kind):
            if BASELINE.get(kind) == name:
                continue
            label = f"{kind}={name}"
            if kind == "optimizer":
                out[label] = {"arch": {}, "optimizer": name}
            elif kind in ARCH_FIELDS:
                out[label] = {"arch": {kind: name}, "optimizer": "adamw"}
            else:
                out[label] = {"status": f"not measured: kind {kind!r} is not a field of the architecture"}
    for label, fields in OPTIONS.items():
        out[label] = {"arch": fields, "optimizer": "adamw"}
    out["recipe=gpt_ngpt"] = {"arch": ngpt_recipe(s), "optimizer": "adamw"}
    return out


def first_measured(label: str) -> int:
    """Sort key: MEASURE_FIRST's order, then every other label after them (a stable sort keeps theirs)."""
    return MEASURE_FIRST.index(label) if label in MEASURE_FIRST else len(MEASURE_FIRST)


def dry_sample(labels, wanted: tuple[str, ...]) -> set[str]:
    """``wanted`` where the registry still has them, else the first variant of the same kind."""
    labels = list(labels)
    chosen = set()
    for label in wanted:
        if label in labels:
            chosen.add(label)
        elif "=" in label:
            kind = label.split("=")[0]
            chosen |= {next((x for x in labels if x.startswith(f"{kind}=")), None)} - {None}
    return chosen


def fuse_adamw_groups(opt: torch.optim.Optimizer) -> None:
    """Make the AdamW groups of ``opt`` (Muon's AdamW half, foreach as built) step with torch's fused kernel, as the
    baseline's AdamW does on a GPU; before the first step, so its state is made for the fused kernel."""
    for group in opt.param_groups:
        if not group.get("muon", False):
            group.update(fused=True, foreach=False)


def build_optimizer(model: torch.nn.Module, name: str, fused_like: bool = False) -> torch.optim.Optimizer:
    """The optimizer ``name`` as a run builds it; ``fused_like``: its AdamW part fused, as the baseline's is."""
    from benchmarks.gpu_check.models import project_adamw

    if name == "adamw":
        return project_adamw(model)
    opt = registry.create("optimizer", name).build(model, lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    if fused_like and not is_fused(opt):
        fuse_adamw_groups(opt)
    return opt


def after_step_of(model: torch.nn.Module):
    """The unit-norm renormalisation the project's callback runs after each step, where the model declares it."""
    from arch_plugins.constraints import renormalize_, unit_norm_parameters

    if not any(True for _ in unit_norm_parameters(model)):
        return None
    renormalize_(model)
    return lambda: renormalize_(model)


def allocated(device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def flops_of(model: torch.nn.Module, s: Shape) -> tuple[float | None, str | None]:
    """Training FLOPs per token, counted on the meta device (or fake tensors); a count that fails costs the row its
    FLOP ratio, never its timings."""
    try:
        return gpt_flops_per_token(model, s.seq), None
    except Exception as exc:
        return None, measure.error_text(exc).splitlines()[0]


class Built:
    """One variant's model, optimizer and step, with what was resident before it was built (its memory is what it
    allocates above that) and its FLOPs per token."""

    def __init__(self, spec: dict, s: Shape, device, x, y, fused_like: bool):
        t0 = time.perf_counter()
        self.resident = allocated(device)
        self.model = build_ours(s, device, **spec["arch"])
        self.opt = build_optimizer(self.model, spec["optimizer"], fused_like)
        self.step = training_step(self.model, self.model, self.opt, x, y, device,
                                  after_step=after_step_of(self.model))
        self.flops_per_token, self.flops_error = flops_of(self.model, s)
        self.build_s = time.perf_counter() - t0

    def compile(self) -> None:
        """Per block, as stage C's ``ours compiled per block``: the model's step runs compiled from now on."""
        from lit.parallel import compile_model

        compile_model(self.model, per_block=True)


def paired(base_step, c: measure.Contender, device, plan: PairingPlan, clock, resident: int, label: str,
           compiled: bool) -> dict:
    """Warm the variant up, one untimed baseline step, then alternating windows; one ratio per round."""
    before = measure.dynamo_counts()
    measure.warm_up(c, device, plan.warmup, resident)
    row = {"status": c.status, **{k: v for k, v in c.info.items() if k in (
        "first_step_s", "loss_step0", "host_issue_s", "device_step_s", "host_bound", "peak_allocated_gib")}}
    row.setdefault("peak_allocated_gib", None)
    if compiled:
        after = measure.dynamo_counts()
        row.update(graphs=after["graphs"] - before["graphs"], graph_breaks=after["breaks"] - before["breaks"])
    if not c.alive:
        row["error"] = c.error
        return row
    base = measure.Contender("baseline", base_step, c.tokens_per_step)
    base_step()  # allocator growth and any lazy state of the baseline's land outside the windows (section 4.3)
    measure.sync(device)
    rounds, wanted = [], plan.rounds
    while len(rounds) < wanted:
        if rounds and not clock.fits(plan.steps * (statistics.median(c.step_s) + statistics.median(base.step_s))):
            row["cut"] = f"{len(rounds)} of {wanted} rounds: budget"
            break
        for who in ((base, c) if len(rounds) % 2 == 0 else (c, base)):
            measure.window(who, device, plan.steps)
        if not (c.alive and base.alive):
            break
        rounds.append(statistics.median(c.step_s[-plan.steps:]) / statistics.median(base.step_s[-plan.steps:]))
        if len(rounds) == plan.rounds and statistics.median(rounds) < CLOSE_RATIO:
            wanted = plan.close_rounds
    if not base.alive:
        raise RuntimeError(f"the baseline failed beside {label}: {base.error}")
    row["status"] = c.status
    if c.error:
        row["error"] = c.error
    if rounds:
        row.update(ratios.summary(label, compiled, rounds), steps_per_window=plan.steps,
                   variant_step_s=statistics.median(c.step_s), baseline_step_s=statistics.median(base.step_s))
    return row


def relative(row: dict, key: str, base_value, ratio_key: str) -> None:
    value = row.get(key)
    row[ratio_key] = value / base_value if value is not None and base_value else None


def where_it_goes(base: dict, step, device) -> list | str:
    """The ops a missed compiled target's step spends the most on beyond the compiled baseline's (profiled once)."""
    try:
        if "ops" not in base:
            base["ops"] = costliest_ops.ms_per_op(base["step"], device, PROFILE_STEPS)
        return costliest_ops.extra(costliest_ops.ms_per_op(step, device, PROFILE_STEPS), base["ops"])
    except Exception as exc:  # a profiler failure costs the row its explanation, never its figures
        return f"not profiled: {measure.error_text(exc).splitlines()[0]}"


def measure_variant(label: str, spec: dict, s: Shape, device, x, y, baselines: dict, plan: PairingPlan, clock,
                    modes: tuple[str, ...]) -> dict[str, dict]:
    """The variant's rows in ``modes`` (eager, compiled), one model: built, paired eager, compiled, paired again."""
    rows: dict[str, dict] = {}
    built = None
    try:
        built = Built(spec, s, device, x, y, baselines["eager"]["adamw_fused"])
        for mode in modes:
            compiled = mode == "compiled"
            if compiled:
                built.compile()
            c = measure.Contender(label, built.step, s.tokens)
            row = paired(baselines[mode]["step"], c, device, plan, clock, built.resident, label, compiled)
            row["flops_per_token"] = built.flops_per_token
            if built.flops_error:
                row["flops_error"] = built.flops_error
            row["adamw_fused"] = is_fused(built.opt)
            relative(row, "flops_per_token", baselines[mode]["flops_per_token"], "flops_ratio")
            relative(row, "peak_allocated_gib", baselines[mode]["peak_allocated_gib"], "memory_ratio")
            if compiled and "MISSED" in row.get("verdict", "") and clock.fits(PROFILE_STEPS * 6 * (
                    row["variant_step_s"] + row["baseline_step_s"]) + 1.0):
                row["costliest_extra_ops"] = where_it_goes(baselines[mode], built.step, device)
            rows[mode] = row
            if not c.alive:
                break
    except Exception as exc:
        for mode in modes:
            rows.setdefault(mode, {"status": "oom" if measure.is_oom(exc) else "failed",
                                   "error": measure.error_text(exc)})
    finally:
        built = None
        measure.free_memory(device)
    for mode in modes:
        rows.setdefault(mode, {"status": f"not run: the {modes[0]} row failed"})
    return rows


def baseline(s: Shape, device, x, y, warmup: int, compiled: bool) -> tuple[dict, measure.Contender]:
    """The baseline in one mode: built, (compiled per block,) warmed up; its row and its contender."""
    from benchmarks.gpu_check.models import project_adamw

    t0 = time.perf_counter()
    resident = allocated(device)
    model = build_ours(s, device)
    opt = project_adamw(model)
    flops = gpt_flops_per_token(model, s.seq)
    build_s = time.perf_counter() - t0
    if compiled:
        from lit.parallel import compile_model

        compile_model(model, per_block=True)
    c = measure.Contender("baseline" + (" compiled per block" if compiled else ""),
                          training_step(model, model, opt, x, y, device), s.tokens)
    measure.warm_up(c, device, max(warmup, 1), resident)
    row = {"status": c.status, "error": c.error, "build_s": build_s, "flops_per_token": flops,
           "adamw_fused": is_fused(opt), "peak_allocated_gib": c.info.get("peak_allocated_gib"),
           **{k: c.info.get(k) for k in ("first_step_s", "host_issue_s", "device_step_s", "host_bound")}}
    row["step_s"] = row["device_step_s"] or row["first_step_s"]
    return row, c


def optimizer_step_alone(s: Shape, device, x, y, reps: int, fused_like: bool) -> dict:
    """Seconds per ``opt.step()`` alone (gradients from one backward kept), per registered optimizer: the host's
    wall time, synchronised at both ends, and the device's time between CUDA events (on a CPU, the same)."""
    out = {}
    for name in registry.names("optimizer"):
        model = opt = step = None
        try:
            model = build_ours(s, device)
            opt = build_optimizer(model, name, fused_like)
            step = training_step(model, model, opt, x, y, device)
            step()  # optimizer state exists

            loss_of(model, x, y, device, True).backward()
            wall, dev = [], []
            for _ in range(reps):
                measure.sync(device)
                t0 = time.perf_counter()
                if device.type == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    opt.step()
                    end.record()
                    measure.sync(device)
                    dev.append(start.elapsed_time(end) / 1e3)
                else:
                    opt.step()
                wall.append(time.perf_counter() - t0)
            out[name] = {"step_s": measure.quantiles(wall), "device_s": measure.quantiles(dev or wall),
                         "adamw_fused": is_fused(opt)}
        except Exception as exc:
            out[name] = {"status": "failed", "error": measure.error_text(exc)}
        finally:
            model = opt = step = None
            measure.free_memory(device)
    return out


def run(ctx, clock, out: dict) -> None:
    dry = ctx.dry
    s = shape(dry)
    warmup = 1 if dry else 2
    # One graph per block per variant accumulates on the same code (Block's forward): room for the whole registry,
    # so that no variant silently falls back to eager at the recompile limit (each compiled row counts its graphs).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 512)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 8192)
    torch._dynamo.reset()
    with measure.compile_backend("eager" if dry else None):  # dry: the same calls, dynamo only (fast on a CPU)
        measure_all(ctx, clock, out, s, warmup)


def measure_all(ctx, clock, out: dict, s: Shape, warmup: int) -> None:
    device, dry = ctx.device, ctx.dry
    x, y = fixed_batch(s, device)
    out.update(shape=vars(s), baseline={}, eager={}, compiled={})
    baselines: dict[str, dict] = {}
    for mode in ("eager", "compiled"):
        row, c = baseline(s, device, x, y, warmup, compiled=mode == "compiled")
        out["baseline"][mode] = row
        if not c.alive:
            out["plan"] = {"text": f"nothing measured: the {mode} baseline failed"}
            return
        baselines[mode] = dict(row, step=c.step)
    todo = variants(s)
    eager_sample = dry_sample(todo, DRY_EAGER)
    compiled_sample = dry_sample(todo, DRY_COMPILED)
    measured = [label for label, spec in todo.items() if "status" not in spec and (
        not dry or EVERY_VARIANT_IN_DRY or label in eager_sample)]
    reserve = 2.0 if dry else 6.0  # the optimizer step alone, at the end
    base_e, base_c = out["baseline"]["eager"], out["baseline"]["compiled"]
    costs = PairingCosts(eager_step_s=base_e["step_s"], compiled_step_s=base_c["step_s"],
                         # the baseline's compile paid the process's first-compile costs; a plugin's graph is larger
                         compile_s=base_c["first_step_s"] - base_c["step_s"] + 1.0,
                         build_s=base_e["build_s"] + 0.3)
    plan = plan_pairings(max(0.0, clock.left() - reserve), len(measured), costs, warmup=warmup, dry=dry)
    out["plan"] = dict(vars(plan), text=plan.describe(), costs=vars(costs))
    print(f"[D] plan: {plan.describe()}", flush=True)
    for label, spec in todo.items():  # the table keeps the registry's order whatever order D measures in
        placeholder = spec if "status" in spec else (NOT_REACHED if label in measured else NOT_IN_DRY)
        out["eager"][label], out["compiled"][label] = dict(placeholder), dict(placeholder)
    spent, done = 0.0, 0
    for label in sorted(measured, key=first_measured):
        spec = todo[label]
        if done and not dry:  # the estimates were guesses: what the variants so far took re-sizes the rest
            new, scaled = replan(plan, costs, spent / done, max(0.0, clock.left() - reserve), len(measured) - done)
            if (new.steps, new.rounds, new.close_rounds) != (plan.steps, plan.rounds, plan.close_rounds):
                print(f"[D] re-planned after {done} variants ({spent / done:.1f} s each): {new.describe()}",
                      flush=True)
                out["plan"].setdefault("replans", []).append({"after": done, "text": new.describe()})
                plan, costs = new, scaled
        modes = ("eager", "compiled") if not dry or EVERY_VARIANT_IN_DRY or label in compiled_sample else ("eager",)
        estimate = costs.variant_s(plan.steps, plan.rounds, plan.rounds, warmup) * (len(modes) / 2)
        if not clock.fits(estimate):
            out["eager"][label], out["compiled"][label] = ({"status": SKIPPED, "estimate_s": estimate}
                                                           for _ in range(2))
            continue
        t0 = time.perf_counter()
        rows = measure_variant(label, spec, s, device, x, y, baselines, plan, clock, modes)
        spent, done = spent + time.perf_counter() - t0, done + 1
        out["eager"][label] = rows["eager"]
        out["compiled"][label] = rows.get("compiled", dict(NOT_IN_DRY))
        getattr(ctx, "save", lambda: None)()
    baselines.clear()
    measure.free_memory(device)
    if clock.fits(1.0 if dry else 4.0):
        out["optimizer_step_alone"] = optimizer_step_alone(s, device, x, y, 2 if dry else 10,
                                                           base_e["adamw_fused"])
    else:
        out["optimizer_step_alone"] = {"status": SKIPPED}
