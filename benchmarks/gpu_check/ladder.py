"""Stage C: the throughput ladder at 124M, 350M and ~1.3B, ours against a plain nanoGPT-style model, one process.

Every rung trains on a fixed batch in bf16 autocast with fp32 cross-entropy. Contenders of a rung run in interleaved
rounds (3 rounds x 10 steps, order rotated). The ceiling is the plain model compiled whole (``torch.compile``,
fused AdamW). Ours runs eager; compiled as ``--model.compile`` compiles it (``lit.parallel.compile_model``: the
whole model; compile time, graphs and breaks reported); compiled per block as it is under FSDP2; and at ~1.3B
sharded with FSDP2 on a one-process mesh (``lit.parallel.shard``, bf16 policy) with and without activation
checkpointing (``lit.parallel.checkpoint_blocks``). Ours uses the project's AdamW (``AdamWOptimizer.build``); one
contender adds ``fused=True`` beside it when the project's is not fused already. (On a checkout whose overlay
compiles per block, ``lit.parallel.compile_blocks``, that is the overlay, and ours is also compiled whole with
``torch.compile`` directly.)

Contenders come in priority order; one that does not fit the stage's time left (estimated from what was measured
so far) is recorded as ``skipped: budget``. At ~1.3B the contenders do not all fit in memory at once, so the rung
runs in two phases that share ``ours eager``: (plain compiled, ours eager), then (ours eager, FSDP2, FSDP2 +
checkpointing; the last two share one sharded model, checkpointing switched on per step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.budget import SKIPPED
from benchmarks.gpu_check.models import (
    Shape,
    build_ours,
    build_plain,
    copy_weights,
    fixed_batch,
    fused_adamw,
    is_fused,
    parameter_count,
    project_adamw,
    training_step,
)
from lit.compute import gpt_flops_per_token

PLAIN_COMPILED, PLAIN_EAGER = "plain compiled", "plain eager"
OURS_EAGER, OURS_OVERLAY, OURS_PER_BLOCK = "ours eager", "ours --model.compile", "ours compiled per block"
OURS_WHOLE, OURS_OVERLAY_FUSED = "ours torch.compile whole", "ours --model.compile + fused AdamW"
OURS_FSDP2, OURS_FSDP2_AC = "ours FSDP2", "ours FSDP2 + activation checkpointing"
COMPILED = {PLAIN_COMPILED, OURS_OVERLAY, OURS_PER_BLOCK, OURS_WHOLE, OURS_OVERLAY_FUSED}


def overlay_is_whole() -> bool:
    """Whether ``--model.compile`` compiles the whole model (``compile_model``) or, on older code, each block."""
    import lit.parallel

    return hasattr(lit.parallel, "compile_model")


def compile_overlay(model: torch.nn.Module, per_block: bool = False) -> None:
    """What ``--model.compile`` does to the model (``per_block``: what it does under FSDP2)."""
    import lit.parallel

    if overlay_is_whole():
        lit.parallel.compile_model(model, per_block=per_block)
    else:
        lit.parallel.compile_blocks(model)


def duplicate_of(name: str) -> str | None:
    """The contender ``name`` would repeat, given what the overlay is, or None."""
    if name == OURS_PER_BLOCK and not overlay_is_whole():
        return OURS_OVERLAY  # the overlay already compiles per block
    if name == OURS_WHOLE and overlay_is_whole():
        return OURS_OVERLAY  # the overlay already compiles the whole model
    return None


@dataclass
class Rung:
    name: str
    shape: Shape
    phases: list[list[str]]
    contenders: dict[str, measure.Contender] = field(default_factory=dict)
    models: dict[str, torch.nn.Module] = field(default_factory=dict)


def rungs(dry: bool) -> list[Rung]:
    if dry:
        s124, s350, s1b = (Shape(32, 2, 2, 32, 128, 2), Shape(48, 2, 2, 32, 128, 2), Shape(64, 2, 4, 32, 128, 2))
    else:
        s124 = Shape(768, 12, 12, 1024, 50304, 16)
        s350 = Shape(1024, 24, 16, 1024, 50304, 8)
        s1b = Shape(2048, 24, 16, 1024, 50304, 4)
    # The dry run compiles each kind of contender once (at the first rung), to stay within a test's time.
    return [
        Rung("124M", s124, [[PLAIN_COMPILED, OURS_EAGER, OURS_OVERLAY, OURS_WHOLE]
                            + ([] if dry else [OURS_PER_BLOCK, OURS_OVERLAY_FUSED])]),
        Rung("350M", s350, [[PLAIN_EAGER, OURS_EAGER] + ([] if dry else [OURS_OVERLAY, PLAIN_COMPILED])]),
        # Plain first: it copies the untrained weights ours was counted on (ours eager trains in its warm-up).
        Rung("1.3B", s1b, [([] if dry else [PLAIN_COMPILED]) + [OURS_EAGER], [OURS_EAGER, OURS_FSDP2, OURS_FSDP2_AC]]),
    ]


class Estimates:
    """Seconds a contender will take: compile from the last compile measured (scaled by depth), steps from the
    FLOPs at a conservative utilisation until a step of this rung has been timed."""

    def __init__(self, ctx):
        self.dry, self.peak = ctx.dry, ctx.peaks.get("flops_measured") or ctx.peaks.get("flops_spec")
        self.compile_s_per_layer: float | None = None
        self.step_s: dict[str, float] = {}

    def step(self, rung: Rung, flops_per_token: float | None) -> float:
        if rung.name in self.step_s:
            return self.step_s[rung.name]
        if self.dry or not (self.peak and flops_per_token):
            return 0.05 if self.dry else 1.0
        return flops_per_token * rung.shape.tokens / (0.25 * self.peak)

    def contender(self, rung: Rung, name: str, flops_per_token, steps: int) -> float:
        run = steps * self.step(rung, flops_per_token) * (2 if name == OURS_FSDP2_AC else 1)
        if name in COMPILED:
            per_layer = self.compile_s_per_layer or (0.5 if self.dry else 5.0)
            run += per_layer * rung.shape.n_layers * (1.5 if name == OURS_PER_BLOCK else 1.0)
        return run


def process_group(device: torch.device):
    """A one-process group and mesh for FSDP2 (nccl on a GPU, gloo on a CPU); whether this call created it."""
    from torch.distributed.device_mesh import init_device_mesh

    created = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1, device_id=device if device.type == "cuda" else None)
        created = True
    return init_device_mesh(device.type, (1,)), created


def toggle_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Switch activation checkpointing of every block on or off (the wrapper is an instance attribute)."""
    from lit.parallel import blocks, checkpoint_blocks

    if on:
        checkpoint_blocks(model)
    else:
        for block in blocks(model):
            vars(block).pop("forward", None)
    if any(("forward" in vars(block)) != on for block in blocks(model)):
        raise RuntimeError("lit.parallel.checkpoint_blocks no longer wraps each block's forward as an instance "
                           "attribute, so the check cannot switch checkpointing off and on: update "
                           "toggle_checkpointing")


class Builder:
    def __init__(self, ctx, rung: Rung, x, y):
        self.ctx, self.rung, self.x, self.y, self.device = ctx, rung, x, y, ctx.device
        self.mesh = None

    def reference(self) -> torch.nn.Module:
        """Ours at the rung's seed, untrained: the weights every plain contender copies (same init at step 0)."""
        if OURS_EAGER in self.rung.models and OURS_EAGER not in self.rung.contenders:
            return self.rung.models[OURS_EAGER]
        return build_ours(self.rung.shape, self.device)

    def build(self, name: str) -> measure.Contender:
        shape, device, x, y = self.rung.shape, self.device, self.x, self.y
        info: dict = {}
        if name in (PLAIN_COMPILED, PLAIN_EAGER):
            model = build_plain(shape, device)
            info["same_init_as_ours"] = copy_weights(self.reference(), model)
            opt = fused_adamw(model, device)
            forward = torch.compile(model, dynamic=False) if name == PLAIN_COMPILED else model
        elif name == OURS_FSDP2_AC:
            base = self.rung.contenders[OURS_FSDP2]
            model, opt = self.rung.models[OURS_FSDP2], base.info["_opt"]
            step = training_step(model, model, opt, x, y, device)

            def with_checkpointing():
                toggle_checkpointing(model, True)
                return step()

            info.update(shares_model_with=OURS_FSDP2, optimizer="project AdamW")
            return measure.Contender(name, with_checkpointing, shape.tokens, info)
        else:
            model = self.rung.models.get(OURS_EAGER) if name == OURS_EAGER else None
            model = model or build_ours(shape, device)
            forward = model
            if name in (OURS_OVERLAY, OURS_OVERLAY_FUSED):
                compile_overlay(model)
            elif name == OURS_PER_BLOCK:
                compile_overlay(model, per_block=True)
            elif name == OURS_WHOLE:
                forward = torch.compile(model, dynamic=False)
            elif name == OURS_FSDP2:
                from lit.parallel import shard

                if self.mesh is None:
                    self.mesh, self.ctx.created_process_group = process_group(device)
                # One process: lit.parallel wraps nothing by default; this row measures the wrapper's own cost.
                shard(model, self.mesh, "bf16-mixed", wrap_one_device=True)
            opt = fused_adamw(model, device) if name == OURS_OVERLAY_FUSED else project_adamw(model)
        info.update(optimizer="fused AdamW" if is_fused(opt) else ("project AdamW" if name.startswith("ours")
                                                                 else "AdamW"), parameters=parameter_count(model))
        self.rung.models[name] = model
        step = training_step(model, forward, opt, x, y, device)
        if name == OURS_FSDP2:
            inner = step

            def step():
                toggle_checkpointing(model, False)
                return inner()
            info["_opt"] = opt
        return measure.Contender(name, step, shape.tokens, info)


def run_rung(ctx, clock, rung: Rung, est: Estimates) -> dict:
    device = ctx.device
    rounds, steps, warmup = (2, 1, 1) if ctx.dry else (3, 10, 5)
    measure.free_memory(device)
    torch._dynamo.reset()
    x, y = fixed_batch(rung.shape, device)
    builder = Builder(ctx, rung, x, y)
    out: dict = {"shape": vars(rung.shape) | {"tokens_per_step": rung.shape.tokens}, "contenders": {}}
    flops = None
    try:
        counted = build_ours(rung.shape, device)  # counted where it lives, never by a CPU forward of a big model
        flops = gpt_flops_per_token(counted, rung.shape.seq)
        out["parameters_ours"] = parameter_count(counted)
        rung.models[OURS_EAGER] = counted  # becomes ours eager (untrained until its warm-up)
    except Exception as exc:
        out["flops_error"] = measure.error_text(exc)
    out["flops_per_token"] = flops
    rows = out["contenders"]
    for p, phase in enumerate(rung.phases):
        later = {n for ph in rung.phases[p + 1:] for n in ph}
        live = []
        for name in phase:
            if name in rung.contenders:
                if rung.contenders[name].alive:
                    live.append(rung.contenders[name])
                continue
            if name == OURS_OVERLAY_FUSED and rung.contenders.get(OURS_EAGER) is not None and \
                    rung.contenders[OURS_EAGER].info.get("optimizer") == "fused AdamW":
                rows[name] = {"status": "not needed: the project's AdamW is fused"}
                continue
            if duplicate_of(name):
                rows[name] = {"status": f"not needed: the same as {duplicate_of(name)}"}
                continue
            estimate = est.contender(rung, name, flops, 1 + warmup + rounds * steps)
            if not clock.fits(estimate):
                rows[name] = {"status": SKIPPED, "estimate_s": estimate}
                continue
            measure.free_memory(device)  # empty the allocator's cache between contenders
            before_graphs = measure.dynamo_counts()
            resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            try:
                c = builder.build(name)
            except Exception as exc:
                c = measure.Contender(name, None, rung.shape.tokens)  # type: ignore[arg-type]
                c.fail(exc)
            rung.contenders[name] = c
            if c.alive:
                build_bytes = (torch.cuda.memory_allocated(device) - resident) if device.type == "cuda" else 0
                before = torch.cuda.memory_allocated(device) - build_bytes if device.type == "cuda" else 0
                measure.warm_up(c, device, warmup, before)
            if name in COMPILED and c.alive:
                after = measure.dynamo_counts()
                c.info.update(compile_s=c.info.get("first_step_s"),
                              graphs=after["graphs"] - before_graphs["graphs"],
                              graph_breaks=after["breaks"] - before_graphs["breaks"])
                if c.info["compile_s"]:
                    est.compile_s_per_layer = c.info["compile_s"] / rung.shape.n_layers / (
                        1.5 if name == OURS_PER_BLOCK else 1.0)
            if not c.alive:  # out of memory or broken: its model goes now, not at the end of the phase
                rung.models.pop(name, None)
                measure.free_memory(device)
            if c.alive:
                live.append(c)
                est.step_s.setdefault(rung.name, c.info.get("device_step_s") or c.info.get("first_step_s") or 1.0)
        measure.interleaved_rounds(live, device, rounds, steps, fits=clock.fits)
        # What no later phase needs is freed before the next one builds.
        for name in list(rung.models):
            if name not in later and not (name == OURS_FSDP2 and OURS_FSDP2_AC in later):
                rung.models.pop(name)
        for name, c in rung.contenders.items():
            if name not in later:
                c.step = None  # type: ignore[assignment]  # its model and optimizer go with it
        measure.free_memory(device)
    peaks = {"spec": ctx.peaks.get("flops_spec"), "measured_gemm": ctx.peaks.get("flops_measured")}
    for name, c in rung.contenders.items():
        c.info.pop("_opt", None)
        rows[name] = measure.summary(c, flops, peaks)
    order = list(dict.fromkeys(n for phase in rung.phases for n in phase))  # the rung's order, not the build's
    out["contenders"] = rows = {n: rows[n] for n in order if n in rows}
    ceiling = rows.get(PLAIN_COMPILED, {}).get("tokens_per_s")
    for row in rows.values():
        if ceiling and row.get("tokens_per_s"):
            row["over_ceiling"] = row["tokens_per_s"] / ceiling
    ref, plain = rows.get(OURS_EAGER, {}), rows.get(PLAIN_COMPILED) or rows.get(PLAIN_EAGER) or {}
    if "loss_step0" in ref and "loss_step0" in plain:
        out["step0_loss_ours_minus_plain"] = ref["loss_step0"] - plain["loss_step0"]
        out["same_init_check"] = ("pass" if plain.get("same_init_as_ours") and
                                  abs(out["step0_loss_ours_minus_plain"]) <= 0.02 else "fail")
    rung.contenders.clear()
    rung.models.clear()
    measure.free_memory(device)
    return out


def run(ctx, clock, out: dict) -> None:
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
    est = Estimates(ctx)
    out["rungs"] = {}
    ctx.created_process_group = False
    try:
        for rung in rungs(ctx.dry):
            if not clock.fits(est.step(rung, None) * 10):
                out["rungs"][rung.name] = {"status": SKIPPED}
                continue
            t0 = time.perf_counter()
            try:
                out["rungs"][rung.name] = run_rung(ctx, clock, rung, est)
                out["rungs"][rung.name]["status"] = "ran"
            except Exception as exc:
                out["rungs"][rung.name] = {"status": "failed", "error": measure.error_text(exc)}
                rung.contenders.clear()
                rung.models.clear()
                measure.free_memory(ctx.device)
            out["rungs"][rung.name]["wall_s"] = time.perf_counter() - t0
    finally:
        ctx.compile_s_per_layer = est.compile_s_per_layer
        if ctx.created_process_group and dist.is_initialized():
            dist.destroy_process_group()
