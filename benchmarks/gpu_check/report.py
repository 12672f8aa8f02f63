"""The check's JSON as Markdown: the results file beside the JSON, and docs/performance/gpu.md.

One renderer for both, so the docs page is always regenerated from a JSON, never edited by hand; ``page(None)``
is the page before any GPU has run the check (what it measures, the command, the budget, no figures).
"""

from __future__ import annotations

from collections.abc import Callable

COMMAND = "python -m benchmarks.gpu_check"

STAGES = [
    ("A", "calibration", "The device (name, SMs, clocks and power from `nvidia-smi`), library versions, and the "
     "peaks every ratio below divides by: a bf16 GEMM of 8192³ and a TF32 GEMM in TFLOP/s and a 1 GiB "
     "device-to-device copy in GB/s, measured, beside the spec sheet's figures (`lit/device_peaks.py`)."),
    ("B", "the real `fit` path", "`lit.cli.main` runs `fit` on `recipes/gpt_baseline.yaml` at 8 layers, 16 x 64 "
     "tokens, 120 steps, at `32-true` and `bf16-mixed`, in this process, with a callback that counts host-device "
     "syncs per step by site (steps 10-19: a `TorchDispatchMode` for data-dependent ops and "
     "`torch.cuda.set_sync_debug_mode`), profiles steps 30-34 (kernel launches, stream syncs and memcpys per step, "
     "GPU-busy %) and stamps startup (call to first step), median step and teardown. Then the same model in a raw "
     "loop: eager, and captured as one CUDA graph per step."),
    ("C", "throughput ladder", "124M (d 768, 12 layers, 12 heads, T 1024, vocabulary 50,304, batch 16), 350M "
     "(d 1024, 24 layers, batch 8) and ~1.3B (d 2048, 24 layers, batch 4; FSDP2 on a one-process mesh through "
     "`lit.parallel.shard`, with and without activation checkpointing: wrapper overhead only, since one process shards "
     "nothing), each against a plain nanoGPT-style model "
     "(`benchmarks/throughput.py`'s `PlainGPT`) compiled whole, in one process. Per contender: tokens/s from the "
     "median step (p20-p80 over 3 interleaved rounds of 10 steps), MFU = training FLOPs per token "
     "(`lit/compute.py`) x tokens/s / peak (spec sheet and measured GEMM), peak memory, compile time apart, and "
     "whether the host is the bottleneck."),
    ("D", "plugins", "Every registered plugin (and the attention options, and the nGPT recipe) at 124M width "
     "(batch 8), two rows on one model: eager against the eager baseline, then compiled per block (each block one "
     "graph, as stage C's `ours compiled per block`) against the baseline compiled the same way. Per row: the step "
     "time over the baseline's (median of per-round ratios, with a 95% t interval on the log ratios), the target "
     "beside it (compiled at most 1.15x, hyper-connections 1.25x, mHC 1.35x, full AttnRes 1.3x; eager at most "
     "1.5x) and a missed target flagged, the FLOPs per token over the baseline's (`lit/compute.py`; an optimizer's "
     "FLOPs are not counted), the peak memory above what was resident (and over the baseline's), host issue time "
     "against device time per step and whether the host is the bottleneck, the compile time and graphs; where a "
     "compiled target is missed, the kernels that cost it (a 2-step profile against the baseline's). Fairness: "
     "at least 10 steps per window, 5 rounds where a ratio is under 1.5x and 3 elsewhere, or what the budget allows "
     "(`budget.plan_pairings` prints and records what it cut, and re-plans as the variants' real cost shows), the "
     "review's costliest plugins measured first so that a short budget reaches them; one "
     "untimed baseline step per pairing; Muon's AdamW half fused like the baseline's. Then the optimizer step "
     "alone, Muon against AdamW, host wall and device time."),
    ("E", "Triton kernels", "`benchmarks.kernels.measure_ops`: each fused op's forward and forward+backward for "
     "eager torch, compiled torch and the Triton kernel at d 1024 with 8 x 1024 tokens, in GB/s and as a share of "
     "the spec and the measured copy bandwidth; `nn.RMSNorm` eager and compiled as a reference; the "
     "`MEASURED_SPEEDUPS` entry for `arch_plugins/kernels/measured.py`."),
]

GUARDS = ("Guards: warm-up steps (and the first, compiling step) are never counted; every timing window is "
          "synchronised and timed with CUDA events; contenders run in interleaved rounds with the order rotated; "
          "inputs are fixed tensors on the device; memory caches are emptied and peaks reset per contender, and an "
          "out-of-memory error is caught per contender; losses are checked finite, and ours and the plain model "
          "start from the same weights (step-0 losses compared); FLOPs are counted on the device, never by a CPU "
          "forward of a large model; a failure in one stage is recorded and the others still run.")


def _f(value, fmt: str = "{:.3g}", none: str = "–") -> str:
    if value is None:
        return none
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _ms(q: dict | None) -> str:
    if not q:
        return "–"
    return f"{q['median'] * 1e3:.2f} [{q['p20'] * 1e3:.2f}-{q['p80'] * 1e3:.2f}]"


def _pct(value) -> str:
    return _f(value, "{:.1%}")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _calibration(a: dict) -> list[str]:
    lines = [f"Device: {a.get('device')}; SMs {a.get('sms', '–')}; versions: "
             + ", ".join(f"{k} {v}" for k, v in a.get("versions", {}).items()), ""]
    smi = a.get("nvidia_smi")
    if isinstance(smi, dict):
        lines += ["nvidia-smi: " + ", ".join(f"{k} {v}" for k, v in smi.items()), ""]
    spec, measured, ratio = a.get("spec", {}), a.get("measured", {}), a.get("measured_over_spec", {})
    rows = [[label, _f(measured.get(key), "{:,.1f}", "–") if measured.get(key) is None else
             f"{measured[key] / scale:,.1f}", "–" if spec.get(key) is None else f"{spec[key] / scale:,.1f}",
             _pct(ratio.get(key))]
            for label, key, scale in (("bf16 GEMM (TFLOP/s)", "bf16_flops", 1e12), ("TF32 GEMM (TFLOP/s)",
                                                                                   "tf32_flops", 1e12),
                                      ("copy (GB/s)", "bandwidth_bytes_per_s", 1e9))]
    return lines + _table(["peak", "measured", "spec sheet", "measured / spec"], rows)


def _status(row: dict) -> str:
    """A row's status, with the first line of its error where it failed."""
    error = (row.get("error") or "").strip()
    return str(row.get("status", "?")) + (f" ({error.splitlines()[0][:160]})" if error else "")


def _real_path(b: dict) -> list[str]:
    lines = []
    rows = []
    for precision, fit in b.get("fits", {}).items():
        if fit.get("status") != "ran":
            rows.append([precision, fit.get("status", "?"), *["–"] * 10])
            continue
        syncs, prof = fit.get("syncs") or {}, fit.get("profile") or {}
        cuda = fit.get("cuda_sync_warnings") or {}
        rows.append([precision, "ran", _f(fit.get("startup_s"), "{:.2f}"), _f(fit.get("median_step_s"), "{:.4f}"),
                     _f(fit.get("teardown_s"), "{:.2f}"), _f(syncs.get("mean_per_step"), "{:.1f}"),
                     str(syncs.get("max_on_steps_that_log_nothing", "–")), _f(cuda.get("mean_per_step"), "{:.1f}"),
                     _f(prof.get("launches_per_step"), "{:.0f}"), _f(prof.get("stream_syncs_per_step"), "{:.1f}"),
                     _f(prof.get("memcpys_per_step"), "{:.1f}"), _pct(prof.get("gpu_busy_fraction"))])
    lines += _table(["precision", "status", "startup s", "median step s", "teardown s", "syncs/step",
                     "max syncs on a step that logs nothing", "CUDA sync warnings/step", "launches/step",
                     "stream syncs/step", "memcpys/step", "GPU busy"], rows)
    for precision, fit in b.get("fits", {}).items():
        for key, title in (("syncs", "Syncs"), ("cuda_sync_warnings", "CUDA sync warnings")):
            sites = (fit.get(key) or {}).get("by_site_per_step") or {}
            if sites:
                lines += ["", f"{title} per step by site ({precision}, steps {fit[key]['steps'][0]}-"
                              f"{fit[key]['steps'][1]}):", ""]
                lines += [f"- {n:.2f} × `{site}`" for site, n in list(sites.items())[:12]]
        parts = fit.get("startup_parts_s")
        if parts:
            lines += ["", f"Startup parts ({precision}): " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items())]
        if fit.get("profile") and "aten_ops_per_step" in fit["profile"]:
            lines += [f"aten ops per step ({precision}, profiled): {fit['profile']['aten_ops_per_step']:.0f}"]
    raw = b.get("raw_loop", {})
    if raw.get("contenders"):
        lines += ["", "Raw loop, same model and batch:", ""]
        lines += _table(["contender", "status", "step ms median [p20-p80]", "tokens/s", "host-bound"],
                        [[name, _status(r), _ms(r.get("step_s")), _f(r.get("tokens_per_s"), "{:,.0f}"),
                          _f(r.get("host_bound"))] for name, r in raw["contenders"].items()])
    elif raw:
        lines += ["", f"Raw loop: {raw.get('status')}"]
    return lines


def _ladder(c: dict) -> list[str]:
    lines = []
    for name, rung in c.get("rungs", {}).items():
        lines += ["", f"#### {name}", ""]
        if rung.get("status") != "ran":
            lines += [f"{rung.get('status')}" + (f": {rung['error'].splitlines()[0]}" if rung.get("error") else "")]
            continue
        lines += [f"Shape {rung['shape']}; ours {_f(rung.get('parameters_ours'), '{:,}')} parameters; "
                  f"{_f(rung.get('flops_per_token'), '{:.4g}')} training FLOPs per token; same-init check "
                  f"{rung.get('same_init_check', '–')} (step-0 loss ours − plain "
                  f"{_f(rung.get('step0_loss_ours_minus_plain'), '{:+.4f}')}).", ""]
        rows = []
        for cname, r in rung.get("contenders", {}).items():
            # The check runs in one process: FSDP2 there shards nothing, so its rows time the wrapper alone.
            label = cname + (" (wrapper overhead only: one process, nothing sharded)"
                             if cname.startswith("ours FSDP2") else "")
            rows.append([label, r.get("status"), _ms(r.get("step_s")), _f(r.get("tokens_per_s"), "{:,.0f}"),
                         _pct(r.get("mfu_spec")), _pct(r.get("mfu_measured_gemm")), _f(r.get("over_ceiling"),
                                                                                       "{:.3f}"),
                         f"{_f(r.get('peak_allocated_gib'), '{:.1f}')} / {_f(r.get('peak_reserved_gib'), '{:.1f}')}",
                         _f(r.get("compile_s"), "{:.1f}"),
                         f"{r['graphs']}/{r['graph_breaks']}" if "graphs" in r else "–", _f(r.get("host_bound")),
                         r.get("optimizer", "–")])
        lines += _table(["contender", "status", "step ms median [p20-p80]", "tokens/s", "MFU (spec)",
                         "MFU (measured GEMM)", "/ ceiling", "peak GiB (own / reserved)", "compile s", "graphs/breaks",
                         "host-bound",
                         "optimizer"], rows)
    return lines


OLD_STAGE_D = ("Measured by the first stage D (commit above): eager rows only, 3 rounds of 3 steps per window, no "
               "interval, no untimed baseline step per pairing, Muon's AdamW half foreach against a fused baseline; "
               "the plugins as they were before issue 43's rewrites.")


def _ci(r: dict) -> str:
    ci = r.get("ratio_ci")
    if not ci:
        return "–"
    return f"{ci[0]:.3f}-{ci[1]:.3f}" if ci[1] != float("inf") else "– (1 round)"


def _gib(r: dict) -> str:
    peak = r.get("peak_allocated_gib")
    if peak is None:
        return "–"
    return f"{peak:.1f}" + (f" ({r['memory_ratio']:.2f}x)" if r.get("memory_ratio") is not None else "")


def _host(r: dict) -> str:
    """Host issue time / device time of one step, in ms."""
    if r.get("host_issue_s") is None:
        return "–"
    device = r.get("device_step_s")
    return f"{r['host_issue_s'] * 1e3:.1f} / " + ("–" if device is None else f"{device * 1e3:.1f}")


def _plugin_rows(rows: dict, compiled: bool) -> list[list[str]]:
    out = []
    for label, r in rows.items():
        cells = [label, _status(r) if r.get("status") != "ran" else "ran", _f(r.get("step_ratio"), "{:.3f}"), _ci(r),
                 f"{r['rounds']} x {r['steps_per_window']}" if "steps_per_window" in r else "–",
                 _f(r.get("target"), "{:.2f}"), f"**{r['verdict']}**" if "MISSED" in r.get("verdict", "") else
                 r.get("verdict", "–"), _f(r.get("flops_ratio"), "{:.3f}"), _gib(r), _host(r),
                 _f(r.get("host_bound"))]
        if compiled:
            cells += [_f(r.get("first_step_s"), "{:.1f}"),
                      f"{r['graphs']}/{r['graph_breaks']}" if "graphs" in r else "–"]
        out.append(cells)
    return out


def _plugins(d: dict) -> list[str]:
    if "plan" not in d:
        return _plugins_first(d)
    lines = [f"Shape {d.get('shape')}.", "", f"Plan: {d['plan'].get('text')}"]
    lines += [f"Re-planned after {p['after']} variants: {p['text']}" for p in d["plan"].get("replans", [])]
    lines += [""]
    base = d.get("baseline", {})
    lines += _table(["baseline", "status", "step ms", "host issue / device ms", "host-bound", "peak GiB",
                     "first step (compile) s", "FLOPs per token", "AdamW fused"],
                    [[mode, _status(b), _f(b.get("step_s") and b["step_s"] * 1e3, "{:.2f}"), _host(b),
                      _f(b.get("host_bound")), _f(b.get("peak_allocated_gib"), "{:.1f}"),
                      _f(b.get("first_step_s"), "{:.1f}"), _f(b.get("flops_per_token"), "{:.4g}"),
                      _f(b.get("adamw_fused"))] for mode, b in base.items()])
    header = ["variant", "status", "step / baseline (median)", "95% interval", "rounds x steps", "target", "verdict",
              "FLOPs / baseline", "peak GiB (/ baseline)", "host issue / device ms", "host-bound"]
    for mode, title in (("compiled", "Compiled per block, against the baseline compiled per block:"),
                        ("eager", "Eager, against the eager baseline:")):
        lines += ["", title, ""]
        # Graphs this variant compiled anew: 0 where its blocks are the baseline's (an optimizer, a parametrization).
        lines += _table(header + (["compile s", "new graphs/breaks"] if mode == "compiled" else []),
                        _plugin_rows(d.get(mode, {}), mode == "compiled"))
    for mode in ("compiled", "eager"):
        missed = [label for label, r in d.get(mode, {}).items() if "MISSED" in r.get("verdict", "")]
        lines += ["", f"Targets missed, {mode}: " + (", ".join(missed) if missed else "none")]
    costs = {label: r["costliest_extra_ops"] for label, r in d.get("compiled", {}).items()
             if r.get("costliest_extra_ops")}
    if costs:
        lines += ["", "Where the missed compiled targets go: the kernels each variant spends the most device time on "
                      "per step beyond the compiled baseline's time on the same kernels (profiled, 2 steps):", ""]
        lines += [f"- {label}: " + (ops if isinstance(ops, str) else "; ".join(
            f"`{name[:90]}` +{ms:.2f} ms" for name, ms in ops)) for label, ops in costs.items()]
    opt = d.get("optimizer_step_alone")
    if isinstance(opt, dict) and opt and "status" not in opt:
        lines += ["", "Optimizer step alone, host wall ms (device ms): " + ", ".join(
            f"{name} {_ms(r.get('step_s'))} ({_ms(r.get('device_s'))})" if "step_s" in r else
            f"{name} {r.get('status')}" for name, r in opt.items())]
    return lines


def _plugins_first(d: dict) -> list[str]:
    """The first stage D's JSON (eager rows only), as it was reported."""
    base = d.get("baseline", {})
    lines = [OLD_STAGE_D, "", f"Shape {d.get('shape')}; baseline step {_f(base.get('step_s'), '{:.4f}')} s.", ""]
    rows = [[label, r.get("status", "?"), _f(r.get("step_ratio"), "{:.3f}"),
             f"{_f(r.get('ratio_min'), '{:.3f}')}-{_f(r.get('ratio_max'), '{:.3f}')}" if "ratio_min" in r else "–",
             _f(r.get("rounds"))] for label, r in d.get("eager", {}).items()]
    lines += _table(["variant", "status", "eager step / baseline (median)", "range over rounds", "rounds"], rows)
    if d.get("compiled"):
        lines += ["", "Compiled whole, both sides:", ""]
        lines += _table(["variant", "status", "step / baseline compiled", "compile s"],
                        [[label, r.get("status", "?"), _f(r.get("step_ratio"), "{:.3f}"),
                          _f(r.get("compile_s"), "{:.1f}")] for label, r in d["compiled"].items()])
    opt = d.get("optimizer_step_alone")
    if isinstance(opt, dict) and opt and "status" not in opt:
        lines += ["", "Optimizer step alone: " + ", ".join(
            f"{name} {_ms(r.get('step_s'))} ms" if "step_s" in r else f"{name} {r.get('status')}"
            for name, r in opt.items())]
    return lines


def _kernels(e: dict) -> list[str]:
    if "ops" not in e:
        return [str(e.get("status", "not measured"))]
    rows = []
    for row in e["ops"]:
        cells = [row["op"]]
        for path in ("eager", "compile", "kernel"):
            cells.append(_ms({"median": row[path]["forward_backward"]["median_s"],
                              "p20": row[path]["forward_backward"]["p20_s"],
                              "p80": row[path]["forward_backward"]["p80_s"]}) if path in row else "–")
        cells += [f"{row['kernel_forward_bytes_per_s'] / 1e9:,.0f} / {row['kernel_backward_bytes_per_s'] / 1e9:,.0f}",
                  f"{_pct(row.get('kernel_forward_fraction_of_spec'))} / "
                  f"{_pct(row.get('kernel_backward_fraction_of_spec'))}",
                  f"{_pct(row.get('kernel_forward_fraction_of_copy'))} / "
                  f"{_pct(row.get('kernel_backward_fraction_of_copy'))}",
                  _f(row.get("speedup_vs_best_torch"), "{:.2f}")]
        rows.append(cells)
    lines = [f"Shape {e.get('shape')}.", ""]
    lines += _table(["op", "eager fwd+bwd ms", "compiled fwd+bwd ms", "Triton fwd+bwd ms", "Triton GB/s fwd / bwd",
                     "of spec bandwidth", "of measured copy", "speedup vs best torch"], rows)
    ref = e.get("rmsnorm_reference")
    if isinstance(ref, dict) and "eager" in ref:
        lines += ["", "nn.RMSNorm forward: " + ", ".join(
            f"{path} {r['bytes_per_s'] / 1e9:,.0f} GB/s ({_pct(r.get('fraction_of_peak'))} of peak)"
            for path, r in ref.items())]
    if e.get("measured_speedups_line"):
        lines += ["", "For `arch_plugins/kernels/measured.py`:", "", "```python", e["measured_speedups_line"], "```"]
    return lines


RENDERERS: dict[str, Callable[[dict], list[str]]] = {"A": _calibration, "B": _real_path, "C": _ladder,
                                                     "D": _plugins, "E": _kernels}


def results(result: dict) -> str:
    """The measured tables, one section per stage, each with its status, time and any error."""
    lines = [f"# GPU check: {result.get('device')}", "",
             f"`{result.get('command', COMMAND)}` on {result.get('date')} (commit {result.get('commit')}); "
             f"budget {result.get('budget_s')} s, wall {_f(result.get('wall_s'), '{:.0f}')} s."
             + (" **Dry run: CPU, tiny shapes; no figure here means anything.**" if result.get("dry") else "")]
    # Notes a person adds to the JSON (how the run was made, what it found); rendered, never computed.
    if result.get("notes"):
        lines += [""] + [f"- {note}" for note in result["notes"]]
    for letter, title, _ in STAGES:
        stage = result.get("stages", {}).get(letter, {"status": "not run"})
        lines += ["", f"### {letter}. {title}", "",
                  f"Status: {stage.get('status')}; {_f(stage.get('wall_s'), '{:.1f}')} s of "
                  f"{_f(stage.get('allotted_s'), '{:.0f}')} s allotted.", ""]
        if stage.get("error"):
            lines += ["```", stage["error"].strip()[:1500], "```", ""]
        # A failed stage still shows what it measured before it failed (the CUDA context can be lost late).
        if stage.get("status") in ("ran", "killed: budget", "failed") and stage.get("out"):
            try:
                lines += RENDERERS[letter](stage["out"])
            except Exception as exc:  # a renderer bug must not lose the JSON's figures: say so and go on
                lines += [f"(could not render this stage: {type(exc).__name__}: {exc}; the JSON has the figures)"]
    return "\n".join(lines) + "\n"


def d_estimate() -> str:
    """Stage D's plan at the first H200 check's figures, by the code that plans a run (``budget.plan_pairings``)."""
    from benchmarks.gpu_check.budget import FIRST_CHECK_H200 as costs
    from benchmarks.gpu_check.budget import plan_pairings
    from benchmarks.gpu_check.plugins import shape as plugin_shape
    from benchmarks.gpu_check.plugins import variants
    from benchmarks.gpu_check.run import DEFAULT_BUDGET_S, NOMINAL_S, RESERVE_S, RUN_ORDER

    count = sum("status" not in spec for spec in variants(plugin_shape(False)).values())
    startup_s = 15.0  # imports, CUDA start-up and stage A (the first check: 0.4 s for A)
    after_a = RUN_ORDER[RUN_ORDER.index("A") + 1:]
    allotted = (DEFAULT_BUDGET_S - RESERVE_S - startup_s) * NOMINAL_S["D"] / sum(NOMINAL_S[s] for s in after_a)
    plan = plan_pairings(allotted - 6.0, count, costs)
    return ("How long (an estimate, before a run): the default run ends within 460 s + 12 s of grace, under 8 "
            f"minutes, whatever the stages find. Stage D is allotted about {allotted:.0f} s. At the first H200 "
            f"check's figures (eager baseline step {costs.eager_step_s * 1e3:.1f} ms at batch 8, measured; compiled "
            f"per block ≈{costs.compiled_step_s * 1e3:.0f} ms, estimated from stage C's batch 16; a plugin's "
            f"per-block compile taken as {costs.compile_s:.1f} s, twice stage C's 2.1 s for the baseline plus a "
            f"second; {costs.build_s:.1f} s to build each variant) one variant costs "
            f"≈{plan.estimate_s / max(plan.variants, 1):.1f} s eager and compiled, so D's plan would be: "
            f"{plan.describe()}. The run replaces these guesses with its baselines' measured step and compile "
            "times, and re-plans after each plugin from what the plugins so far took. E took 15 s on the first "
            "check; C and B get what is left (C's ladder and B's fits were measured then, below).")


def page(result: dict | None) -> str:
    """docs/performance/gpu.md: what the check measures and how to run it, then the latest results (or none)."""
    from benchmarks.gpu_check.run import RUN_ORDER

    lines = ["# Performance on a GPU", "",
             "`benchmarks/gpu_check` measures, on one GPU and in one command, what a run here costs against its "
             "math: the device's peaks, the real training path's syncs and overhead, a throughput ladder against a "
             "plain nanoGPT-style model, every plugin's step-time ratio, and the Triton kernels.", "",
             "```bash", f"{COMMAND}                 # one GPU, at most 8 minutes (--budget_s 460 by default)",
             f"{COMMAND} --dry           # any machine: every stage on CPU at tiny shapes (what the tests run)",
             "```", "",
             "The budget (`--budget_s`, 460 s by default) counts from the start of the process, imports included. "
             f"The stages run in the order {' '.join(RUN_ORDER)}: D, what the check must answer, right after the "
             "peaks, and B last, since its CUDA-graph contender lost the CUDA context on the first H200 check. "
             "Each stage reads one global deadline: it is allotted its nominal share of the time left (what an "
             "earlier stage did not use flows on), and each contender, plugin or compile inside it that would not "
             "fit is recorded as `skipped: budget` rather than run. A watchdog writes whatever was measured and "
             "ends the process 12 s after the deadline, should an estimate be wrong; the JSON, its Markdown and "
             "this page are also written after every stage and every plugin of D, so a run cut short from outside "
             "leaves what it finished. A failure in one stage is recorded and the others still run. `--stages AC` "
             "runs some stages only. The results go to `benchmarks/results/gpu_check_<device>.json` and `.md`, and "
             "this page is rewritten from the JSON (a `--dry` run writes its page beside its JSON instead).", "",
             d_estimate(), "",
             "| stage | nominal budget | what it measures |", "|---|---:|---|"]

    from benchmarks.gpu_check.run import NOMINAL_S

    lines += [f"| {letter}. {title} | {NOMINAL_S[letter]:.0f} s | {text} |" for letter, title, text in STAGES]
    lines += ["", GUARDS, ""]
    if result is None:
        lines += ["## Results", "",
                  "**No GPU has been available to run the check yet: there are no measured figures on this page.** "
                  "The performance figures elsewhere in these docs were measured on CPUs. Run the command above on a "
                  "GPU and this section is replaced by its tables.", ""]
        return "\n".join(lines)
    body = results(result).splitlines()
    body[0] = "## Results: " + body[0].removeprefix("# GPU check: ")
    return "\n".join(lines + body) + "\n"
