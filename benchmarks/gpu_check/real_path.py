"""Stage B: the real ``fit`` path in the small-run regime, and the same model in a raw loop (eager, CUDA graph).

``lit.cli.main(["fit", recipes/gpt_baseline.yaml, 8 layers, 16 x 64 tokens, ~120 steps])`` runs in this process at
``32-true`` and at ``bf16-mixed``, with one extra callback (``Audit``) that:

1. counts the host-device syncs of steps 10-19 by site: a ``TorchDispatchMode`` catching the ops that must read a
   device value on the host (``_local_scalar_dense``, ``nonzero``, boolean indexing, ...) plus Python patches of
   ``Tensor.tolist/.cpu/.numpy``, device-independent, so the dry run on a CPU counts what a GPU would; on CUDA also
   ``torch.cuda.set_sync_debug_mode("warn")``, which catches what the dispatcher cannot see (blocking copies);
2. profiles steps 30-34 with ``torch.profiler``: kernel launches, stream synchronisations and memcpys per step, and
   GPU-busy % (kernel time over wall time); on a CPU, the aten ops per step (a launch proxy);
3. stamps startup (the call to the first step, with its parts), the median step and teardown.

Then the same model and batch in a raw loop with AdamW: eager, and on CUDA one captured CUDA graph per step
(capturable AdamW) — the floor the lean path could reach.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import lightning as L
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.budget import SKIPPED
from benchmarks.gpu_check.models import Shape, fixed_batch, loss_of
from lit.models import GPT, TransformerConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "gpt_baseline.yaml"
aten = torch.ops.aten

# Ops whose result the host must wait for (their output shape or value is data-dependent), as the review's
# appendix A counts them.
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.nonzero_static.default,
            aten.masked_select.default, aten.is_nonzero.default, aten.equal.default,
            aten.unique_dim.default, aten._unique2.default, aten.unique_consecutive.default,
            aten.repeat_interleave.Tensor, aten.allclose.default}
PATCHED = ("tolist", "cpu", "numpy")
DRY_LOG_EVERY = 5
OWN_FRAMES = (f"{Path(__file__).parent}",)
WRAPPERS = ("lit/cli.py", "lit/commands.py", "lit/errors.py")  # frames every call passes through: no site


def _where(frame: traceback.FrameSummary) -> str:
    name = frame.filename
    for root in (str(REPO) + "/", "site-packages/"):
        if root in name:
            name = name.split(root, 1)[1]
    return f"{name}:{frame.lineno} ({frame.name})"


def call_site(stack: list[traceback.FrameSummary]) -> str:
    """Where a sync came from: the innermost frame outside torch (often a Lightning line), and, when that is not
    this repository's code, the innermost frame of lit/ or arch_plugins/ below the CLI that led to it."""
    frames = [f for f in stack if not f.filename.startswith(OWN_FRAMES)]
    outside_torch = [f for f in frames if "/torch/" not in f.filename] or frames or stack
    site = outside_torch[-1]
    ours = [f for f in frames if f.filename.startswith(str(REPO)) and "site-packages" not in f.filename
            and not f.filename.endswith(WRAPPERS)]
    if ours and ours[-1] is not site:
        return f"{_where(site)} via {_where(ours[-1])}"
    return _where(site)


class SyncCounter(TorchDispatchMode):
    """Records (step, op, site) for every op that makes the host wait on the device.

    With ``device_only`` (a CUDA run) only ops on device tensors count: reading a CPU tensor waits for nothing. On a
    CPU (the dry run) every such op counts, as the ops a GPU run would wait on, except those of ``torch.optim``:
    its step counters stay on the host on a GPU too (unless capturable or fused), so reading them waits for nothing.
    """

    def __init__(self, state: dict, device_only: bool = False):
        super().__init__()
        self.state, self.events, self.device_only = state, [], device_only

    def _on_device(self, args) -> bool:
        return not self.device_only or any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args)

    def record(self, kind: str) -> None:
        stack = traceback.extract_stack()[:-2]
        if not self.device_only and any("/torch/optim/" in f.filename for f in stack):
            return
        self.events.append((self.state["step"], kind, call_site(stack)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []))
        if (func in SYNC_OPS or boolean_index) and self._on_device(args):
            self.record(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._originals = {name: getattr(torch.Tensor, name) for name in PATCHED}
        for name, original in self._originals.items():
            def patched(tensor, *args, _original=original, _name=name, **kwargs):
                if self._on_device([tensor]):
                    self.record(f"Tensor.{_name}")
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, name, patched)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)


class CudaSyncWarnings:
    """``torch.cuda.set_sync_debug_mode("warn")`` with each warning recorded with its site, between enter/exit."""

    def __init__(self, state: dict):
        self.state, self.events = state, []

    def _show(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message).lower():
            stack = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("/warnings.py")]
            self.events.append((self.state["step"], "cuda_sync", call_site(stack)))

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(*exc)


# What the running fit's Audit reads (set by run_fit before it calls the CLI; the CLI builds the callback by name).
PLAN: dict = {}


class Audit(L.Callback):
    """Added to the fit with ``--trainer.callbacks+=benchmarks.gpu_check.real_path.Audit``; see the module docstring."""

    def __init__(self):
        self.plan = PLAN
        self.plan["audit"] = self
        self.state = {"step": -1}
        self.stamps: dict[str, float] = {}
        self.batch_end: dict[int, float] = {}
        self.syncs: list = []  # from the dispatch counter: device-independent
        self.cuda_syncs: list = []  # from CUDA's sync debug mode (a GPU only)
        self.profile: dict | None = None
        self._counter = self._cuda = self._prof = None

    def _stamp(self, name: str) -> None:
        self.stamps.setdefault(name, time.perf_counter())

    def setup(self, trainer, pl_module, stage):
        self._stamp("setup")

    def on_sanity_check_start(self, trainer, pl_module):
        self._stamp("sanity_start")

    def on_sanity_check_end(self, trainer, pl_module):
        self._stamp("sanity_end")

    def on_train_start(self, trainer, pl_module):
        self._stamp("train_start")
        self.device = pl_module.device

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        self._stamp("first_step")
        self.state["step"] = step
        p = self.plan
        if step == p["sync"][0]:
            self._counter = SyncCounter(self.state, device_only=self.device.type != "cpu").__enter__()
            if self.device.type == "cuda":
                self._cuda = CudaSyncWarnings(self.state).__enter__()
        if step == p["sync"][1]:
            self._stop_sync_count()
        if step == p["profile"][0]:
            self._start_profile()
        if step == p["profile"][1]:
            self._stop_profile()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batch_end[trainer.global_step] = time.perf_counter()  # global_step now counts this batch

    def on_train_end(self, trainer, pl_module):
        self.close()
        self._stamp("train_end")

    def on_exception(self, trainer, pl_module, exception):
        self.close()

    def close(self):
        """Leave the sync counting and the profiler, wherever the fit stopped (idempotent)."""
        self._stop_sync_count()
        self._stop_profile()

    def _stop_sync_count(self):
        if self._cuda is not None:
            self._cuda.__exit__(None, None, None)
            self.cuda_syncs += self._cuda.events
            self._cuda = None
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.syncs += self._counter.events
            self._counter = None

    def _start_profile(self):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        measure.sync(self.device)
        self._prof = profile(activities=activities)
        self._prof.__enter__()
        self._prof_t0 = time.perf_counter()

    def _stop_profile(self):
        if self._prof is None:
            return
        measure.sync(self.device)
        wall = time.perf_counter() - self._prof_t0
        self._prof.__exit__(None, None, None)
        steps = self.plan["profile"][1] - self.plan["profile"][0]
        self.profile = profile_counts(self._prof, steps, wall, self.device.type == "cuda")
        self._prof = None


# CUDA runtime and driver calls the profiler records, by name prefix (versions add suffixes such as _v7000 or ExC).
RUNTIME_CALLS = {"launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel"),
                 "graph_launches": ("cudaGraphLaunch", "cuGraphLaunch"),
                 "stream_syncs": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                                  "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"),
                 "memcpys": ("cudaMemcpy", "cuMemcpy")}


def profile_counts(prof, steps: int, wall_s: float, cuda: bool) -> dict:
    """Per step: CUDA runtime calls by kind and GPU-busy %; on a CPU, top-level aten ops (a launch proxy)."""
    from torch.autograd import DeviceType

    counts, kernel_us, aten_ops = Counter(), 0.0, 0
    for event in prof.events():
        name = event.name
        if getattr(event, "device_type", None) == DeviceType.CUDA:
            kernel_us += event.time_range.elapsed_us()
            continue
        for kind, prefixes in RUNTIME_CALLS.items():
            if name.startswith(prefixes):
                counts[kind] += 1
        parent = getattr(event, "cpu_parent", None)
        if name.startswith("aten::") and (parent is None or not parent.name.startswith("aten::")):
            aten_ops += 1
    out = {"steps": steps, "wall_s_per_step": wall_s / steps, "aten_ops_per_step": aten_ops / steps}
    if cuda:
        out.update({f"{kind}_per_step": counts[kind] / steps for kind in RUNTIME_CALLS})
        out["gpu_busy_fraction"] = kernel_us / 1e6 / wall_s
    return out


def sync_report(events: list, steps: range, log_every: int) -> dict:
    """Syncs per step (total and on steps that log nothing) and by site."""
    per_step = Counter(step for step, _, _ in events)
    counts = [per_step.get(s, 0) for s in steps]
    # Lightning logs after batch i when (i + 1) % log_every_n_steps == 0; global_step at batch start is i.
    quiet = [per_step.get(s, 0) for s in steps if (s + 1) % log_every != 0]
    by_site = Counter(f"{kind} @ {site}" for _, kind, site in events)
    return {"steps": [steps.start, steps.stop - 1], "per_step": counts,
            "mean_per_step": sum(counts) / max(1, len(counts)),
            "max_on_steps_that_log_nothing": max(quiet, default=0),
            "by_site_per_step": {k: v / max(1, len(counts)) for k, v in by_site.most_common()}}


def fit_args(ctx, precision: str, workdir: Path) -> list[str]:
    layers, batch, block, steps = (2, 4, 16, ctx.b_steps) if ctx.dry else (8, 16, 64, ctx.b_steps)
    args = ["fit", "--config", str(RECIPE), f"--model.arch.n_layers={layers}", f"--data.batch_size={batch}",
            f"--data.block_size={block}", f"--trainer.max_steps={steps}", f"--trainer.precision={precision}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={workdir}",
            "--trainer.callbacks+=benchmarks.gpu_check.real_path.Audit",
            # Eager, as the raw loop it is compared with: the default (auto) would run this size as CUDA graphs
            # on a GPU, which benchmarks.sweep_fill measures.
            "--model.compile=false"]
    if ctx.dry:
        # Without MLflow: creating its store is seconds of CPU that would double the dry run's cost in the tests.
        args += ["--model.arch.d_model=32", "--model.arch.n_heads=2", "--trainer.logger=false",
                 f"--trainer.log_every_n_steps={DRY_LOG_EVERY}"]  # a log step inside the dry sync window
    else:
        args += [f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir}/mlflow.db"]
    return args


def run_fit(ctx, precision: str) -> dict:
    from lit.cli import main

    sync_window = (2, 6) if ctx.dry else (10, 20)
    profile_window = (7, 9) if ctx.dry else (30, 35)
    PLAN.clear()
    PLAN.update(sync=sync_window, profile=profile_window)
    with tempfile.TemporaryDirectory(prefix="gpu_check_fit_") as tmp:
        args = fit_args(ctx, precision, Path(tmp))
        t_call = time.perf_counter()
        exit_code = 0
        try:
            main(args)
        except SystemExit as exc:
            exit_code = exc.code
        finally:
            if PLAN.get("audit") is not None:  # a fit that failed must not leave sync warnings on for later stages
                PLAN["audit"].close()
        t_return = time.perf_counter()
    audit: Audit | None = PLAN.get("audit")
    out: dict = {"args": args[1:], "exit_code": exit_code}
    if audit is None or exit_code not in (0, None):
        out["status"] = "failed"
        out["error"] = f"fit exited with {exit_code} before the audit callback ran" if audit is None else \
            f"fit exited with {exit_code}"
        return out
    s = audit.stamps
    ends = sorted(audit.batch_end.items())
    steady = [t for step, t in ends if step > profile_window[1]]
    gaps = [b - a for a, b in zip(steady, steady[1:], strict=False)]
    log_every = DRY_LOG_EVERY if ctx.dry else yaml.safe_load(RECIPE.read_text())["trainer"].get("log_every_n_steps", 50)
    out.update(
        status="ran", steps=len(ends),
        startup_s=s["first_step"] - t_call,
        startup_parts_s={"parse_and_build": s.get("setup", t_call) - t_call,
                         "setup_to_sanity": s.get("sanity_start", s.get("train_start", t_call))
                         - s.get("setup", t_call),
                         "sanity_validation": s.get("sanity_end", 0) - s.get("sanity_start", 0),
                         "to_first_step": s["first_step"] - s.get("train_start", s["first_step"])},
        median_step_s=statistics.median(gaps) if gaps else None,
        mean_step_s=(steady[-1] - steady[0]) / (len(steady) - 1) if len(steady) > 1 else None,
        steady_steps=len(gaps),
        teardown_s=t_return - s.get("train_end", t_return),
        syncs=sync_report(audit.syncs, range(*sync_window), log_every),
        cuda_sync_warnings=(sync_report(audit.cuda_syncs, range(*sync_window), log_every)
                            if getattr(audit, "device", torch.device("cpu")).type == "cuda" else None),
        profile=audit.profile,
    )
    return out


def raw_loop(ctx, clock) -> dict:
    """The fit's model and batch size in a plain loop: eager, and (CUDA) one captured graph per step."""
    device, dry = ctx.device, ctx.dry
    recipe_arch = yaml.safe_load(RECIPE.read_text())["model"]["init_args"]["arch"]
    shape = Shape(d_model=32 if dry else recipe_arch["d_model"], n_layers=2 if dry else 8,
                  n_heads=2 if dry else recipe_arch["n_heads"], seq=16 if dry else 64, vocab=65,
                  batch=4 if dry else 16)
    cfg = TransformerConfig(**(recipe_arch | {"d_model": shape.d_model, "n_layers": shape.n_layers,
                                              "n_heads": shape.n_heads}))
    x, y = fixed_batch(shape, device)
    contenders = []
    for amp in (False, True):
        tag = "bf16" if amp else "fp32"
        torch.manual_seed(0)
        with torch.device(device):
            model = GPT(shape.vocab, shape.seq, cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

        def eager(model=model, opt=opt, amp=amp):
            loss = loss_of(model, x, y, device, amp)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        contenders.append(measure.Contender(f"eager {tag}", eager, shape.tokens, {"amp": amp}))
    rows = timed_rows(contenders, device, dry, clock)
    if device.type != "cuda":
        rows["cuda graph"] = {"status": "skipped: needs CUDA"}
        return {"shape": vars(shape) | {"tokens": shape.tokens}, "contenders": rows}
    # The captured graphs are timed after the eager loop's rows are kept: on the first H200 check a replay hit an
    # illegal memory access, which is sticky (every later CUDA call in the process fails), and took the eager rows
    # with it. Their ratio to eager then comes from consecutive, not interleaved, rounds.
    out = {"shape": vars(shape) | {"tokens": shape.tokens}, "contenders": rows}
    graphs = [graph_contender(shape, cfg, x.clone(), y.clone(), device, amp, "bf16" if amp else "fp32")
              for amp in (False, True)]
    try:
        rows.update(timed_rows(graphs, device, dry, clock))
    except Exception as exc:
        rows["cuda graph"] = {"status": "failed", "error": measure.error_text(exc)}
    return out


def timed_rows(contenders: list[measure.Contender], device, dry: bool, clock) -> dict:
    for c in contenders:
        if c.alive:
            measure.warm_up(c, device, 2 if dry else 5, 0)
    measure.interleaved_rounds(contenders, device, rounds=2 if dry else 3, steps=2 if dry else 20, fits=clock.fits)
    return {c.name: measure.summary(c, None, {}) for c in contenders}


def graph_contender(shape, cfg, x, y, device, amp: bool, tag: str) -> measure.Contender:
    """A whole training step captured once as a CUDA graph and replayed (capturable AdamW, static inputs)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(shape.vocab, shape.seq, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=True)
    c = measure.Contender(f"cuda graph {tag}", None, shape.tokens, {"amp": amp})  # type: ignore[arg-type]

    def one():
        # The autocast cache must be off inside a graph (a cached cast would be a tensor of the capture).
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        return loss

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                one()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = one()

        def replay():
            graph.replay()
            return static_loss

        c.step = replay
    except Exception as exc:
        c.fail(exc)
    return c


def run(ctx, clock, out: dict) -> None:
    out["fits"] = {}
    precisions = ("32-true", "bf16-mixed")
    for i, precision in enumerate(precisions):
        # A fit costs about what the last one did (the first also pays one-time imports and initialisation).
        estimate = out["fits"][precisions[0]].get("wall_s", 0) if i else 0
        if not clock.fits(estimate):
            out["fits"][precision] = {"status": SKIPPED}
            continue
        t0 = time.perf_counter()
        try:
            out["fits"][precision] = run_fit(ctx, precision)
        except Exception as exc:
            out["fits"][precision] = {"status": "failed", "error": measure.error_text(exc)}
        out["fits"][precision]["wall_s"] = time.perf_counter() - t0
    if clock.fits(2 if ctx.dry else 10):
        try:
            out["raw_loop"] = raw_loop(ctx, clock)
        except Exception as exc:
            out["raw_loop"] = {"status": "failed", "error": measure.error_text(exc)}
    else:
        out["raw_loop"] = {"status": SKIPPED}
