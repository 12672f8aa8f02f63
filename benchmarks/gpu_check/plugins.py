"""Stage D: every registered plugin's eager step time over the baseline's, at 124M width, in paired rounds.

The baseline is ours at 124M width (d 768, 12 layers, 12 heads, T 1024, B 8): rmsnorm, add, linear, sp, AdamW. Each
variant changes one thing: every name the registry lists for every kind (read from the registry, so a plugin
installed later is measured too), the attention options (clipped softmax, QK-norm with a logit soft-cap, gated
attention) and the nGPT recipe (hypersphere norm and nGPT residual together, renormalised after each step as its
callback does). A variant and the baseline, both alive, run in alternating windows (3 rounds); the ratio is taken
per round, variant over baseline, so drift cancels, and does not depend on any FLOP count. One variant at a time is
alive beside the baseline, so memory stays that of two models.

Then, as time allows, the same ratio with both compiled whole (nGPT, hyper-connections, block AttnRes,
Pattention), and the optimizer step alone, Muon against AdamW.
"""

from __future__ import annotations

import statistics
import time

import torch

from arch_plugins import registry
from benchmarks.gpu_check import measure
from benchmarks.gpu_check.budget import SKIPPED
from benchmarks.gpu_check.models import Shape, build_ours, fixed_batch, loss_of, project_adamw, training_step
from lit.models import TransformerConfig

BASELINE = {"norm": "rmsnorm", "residual": "add", "projection": "linear", "parametrization": "sp",
            "optimizer": "adamw"}
OPTIONS = {"clipped softmax": {"clipped_softmax_gamma": -0.03},
           "qk_norm + logit soft-cap": {"qk_norm": "rmsnorm", "logit_softcap": 30.0},
           "gated attention": {"gated_attention": True}}
COMPILED = ("recipe=gpt_ngpt", "residual=hyperconn", "residual=attnres_block", "projection=pattention")
ARCH_FIELDS = set(TransformerConfig.__dataclass_fields__)


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


def build_optimizer(model: torch.nn.Module, name: str) -> torch.optim.Optimizer:
    if name == "adamw":
        return project_adamw(model)
    return registry.create("optimizer", name).build(model, lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))


def after_step_of(model: torch.nn.Module):
    """The unit-norm renormalisation the project's callback runs after each step, where the model declares it."""
    from arch_plugins.constraints import renormalize_, unit_norm_parameters

    if not any(True for _ in unit_norm_parameters(model)):
        return None
    renormalize_(model)
    return lambda: renormalize_(model)


def contender(label: str, spec: dict, s: Shape, device, x, y, compiled: bool) -> tuple[measure.Contender, object]:
    model = build_ours(s, device, **spec["arch"])
    opt = build_optimizer(model, spec["optimizer"])
    forward = torch.compile(model, dynamic=False) if compiled else model
    step = training_step(model, forward, opt, x, y, device, after_step=after_step_of(model))
    return measure.Contender(label, step, s.tokens, {}), opt


def paired(base_step, c: measure.Contender, device, rounds: int, steps: int, warmup: int, clock) -> dict:
    """Variant and baseline in alternating windows; per round, variant step / baseline step (medians)."""
    base = measure.Contender("baseline", base_step, c.tokens_per_step)
    measure.warm_up(c, device, warmup, torch.cuda.memory_allocated(device) if device.type == "cuda" else 0)
    if not c.alive:
        return {"status": c.status, "error": c.error}
    ratios = []
    for r in range(rounds):
        if r and not clock.fits(2 * steps * (statistics.median(c.step_s) + statistics.median(base.step_s))):
            break
        for who in ((base, c) if r % 2 == 0 else (c, base)):
            measure.window(who, device, steps)
        if not (c.alive and base.alive):
            break
        ratios.append(statistics.median(c.step_s[-steps:]) / statistics.median(base.step_s[-steps:]))
    row = {"status": c.status if c.alive else c.status, "first_step_s": c.info.get("first_step_s"),
           "loss_step0": c.info.get("loss_step0")}
    if c.error:
        row["error"] = c.error
    if ratios:
        row.update(step_ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                   rounds=len(ratios), variant_step_s=statistics.median(c.step_s),
                   baseline_step_s=statistics.median(base.step_s))
    return row


def optimizer_step_alone(s: Shape, device, x, y, reps: int) -> dict:
    """Seconds per ``opt.step()`` alone (gradients from one backward kept), per registered optimizer."""
    out = {}
    for name in registry.names("optimizer"):
        try:
            model = build_ours(s, device)
            opt = build_optimizer(model, name)
            step = training_step(model, model, opt, x, y, device)
            step()  # optimizer state exists

            loss_of(model, x, y, device, True).backward()
            times = []
            for _ in range(reps):
                measure.sync(device)
                t0 = time.perf_counter()
                opt.step()
                measure.sync(device)
                times.append(time.perf_counter() - t0)
            out[name] = {"step_s": measure.quantiles(times)}
        except Exception as exc:
            out[name] = {"status": "failed", "error": measure.error_text(exc)}
        finally:
            model = opt = step = None
            measure.free_memory(device)
    return out


def run(ctx, clock, out: dict) -> None:
    device, dry = ctx.device, ctx.dry
    s = shape(dry)
    rounds, steps, warmup = (1, 1, 0) if dry else (3, 3, 2)
    x, y = fixed_batch(s, device)
    torch._dynamo.reset()
    base_model = build_ours(s, device)
    base = measure.Contender("baseline", training_step(base_model, base_model, project_adamw(base_model), x, y,
                                                       device), s.tokens)
    measure.warm_up(base, device, warmup + 2, 0)
    if not base.alive:
        out.update(shape=vars(s), baseline={"status": base.status, "error": base.error})
        return
    base_s = base.info.get("device_step_s") or base.info["first_step_s"]
    out.update(shape=vars(s), baseline={"first_step_s": base.info["first_step_s"], "step_s": base_s},
               eager={}, compiled={})
    todo = variants(s)
    # The dry run measures one variant of each kind (and one option, and the recipe): every path, in a test's time.
    sampled = {next((label for label in todo if label.startswith(f"{kind}=")), None) for kind in registry.kinds()}
    sampled |= {next(iter(OPTIONS)), "recipe=gpt_ngpt"}
    for label, spec in todo.items():
        if dry and label not in sampled:
            spec = {"status": "not run in --dry (one variant per kind is)"}
        if "status" in spec:
            out["eager"][label] = spec
            continue
        estimate = (1 + warmup + 2 * rounds * steps) * base_s * 1.5 + (0.05 if dry else 0.5)
        if not clock.fits(estimate):
            out["eager"][label] = {"status": SKIPPED, "estimate_s": estimate}
            continue
        try:
            c, _ = contender(label, spec, s, device, x, y, compiled=False)
            out["eager"][label] = paired(base.step, c, device, rounds, steps, warmup, clock)
        except Exception as exc:
            out["eager"][label] = {"status": "oom" if measure.is_oom(exc) else "failed",
                                   "error": measure.error_text(exc)}
        c = None
        measure.free_memory(device)
    # Compiled: both sides compiled whole; first the baseline, then each variant while time allows.
    compile_s = ctx.compile_s_per_layer * s.n_layers if getattr(ctx, "compile_s_per_layer", None) else (
        2.0 if dry else 60.0)
    # Not in the dry run: the path is the eager one's with torch.compile, which stage C's dry run exercises.
    names = () if dry else COMPILED
    base_compiled = None
    if dry:
        out["compiled"]["(all)"] = {"status": "not run in --dry"}
    for label in names:
        if not clock.fits(2 * compile_s if base_compiled is None else compile_s):
            out["compiled"][label] = {"status": SKIPPED, "estimate_s": compile_s}
            continue
        try:
            if base_compiled is None:
                base_compiled, _ = contender("baseline compiled", {"arch": {}, "optimizer": "adamw"}, s, device, x,
                                             y, compiled=True)
                measure.warm_up(base_compiled, device, warmup, 0)
                out["compiled"]["baseline"] = {"status": base_compiled.status,
                                               "compile_s": base_compiled.info.get("first_step_s")}
            c, _ = contender(label, todo[label], s, device, x, y, compiled=True)
            out["compiled"][label] = paired(base_compiled.step, c, device, rounds, steps, warmup, clock)
            out["compiled"][label]["compile_s"] = out["compiled"][label].pop("first_step_s", None)
        except Exception as exc:
            out["compiled"][label] = {"status": "failed", "error": measure.error_text(exc)}
        c = None
        measure.free_memory(device)
    base_compiled = None
    base = base_model = None
    measure.free_memory(device)
    if clock.fits(2.0 if dry else 10.0):
        out["optimizer_step_alone"] = optimizer_step_alone(s, device, x, y, 2 if dry else 10)
    else:
        out["optimizer_step_alone"] = {"status": SKIPPED}
