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
     "`lit.parallel.shard`, with and without activation checkpointing), each against a plain nanoGPT-style model "
     "(`benchmarks/throughput.py`'s `PlainGPT`) compiled whole, in one process. Per contender: tokens/s from the "
     "median step (p20-p80 over 3 interleaved rounds of 10 steps), MFU = training FLOPs per token "
     "(`lit/compute.py`) x tokens/s / peak (spec sheet and measured GEMM), peak memory, compile time apart, and "
     "whether the host is the bottleneck."),
    ("D", "plugins", "Every registered plugin (and the attention options, and the nGPT recipe) at 124M width: its "
     "eager step time over the baseline's, in paired rounds; compiled whole for nGPT, hyper-connections, block "
     "AttnRes and Pattention as time allows; the optimizer step alone, Muon against AdamW."),
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
            rows.append([cname, r.get("status"), _ms(r.get("step_s")), _f(r.get("tokens_per_s"), "{:,.0f}"),
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


def _plugins(d: dict) -> list[str]:
    base = d.get("baseline", {})
    lines = [f"Shape {d.get('shape')}; baseline step {_f(base.get('step_s'), '{:.4f}')} s.", ""]
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


def page(result: dict | None) -> str:
    """docs/performance/gpu.md: what the check measures and how to run it, then the latest results (or none)."""
    lines = ["# Performance on a GPU", "",
             "`benchmarks/gpu_check` measures, on one GPU and in one command, what a run here costs against its "
             "math: the device's peaks, the real training path's syncs and overhead, a throughput ladder against a "
             "plain nanoGPT-style model, every plugin's step-time ratio, and the Triton kernels.", "",
             "```bash", f"{COMMAND}                 # one GPU, at most 8 minutes (--budget_s 460 by default)",
             f"{COMMAND} --dry           # any machine: every stage on CPU at tiny shapes (what the tests run)",
             "```", "",
             "The budget (`--budget_s`, 460 s by default) counts from the start of the process, imports included. "
             "Each stage reads one global deadline: it is allotted its nominal share of the time left (what an "
             "earlier stage did not use flows on), and each contender, plugin or compile inside it that would not "
             "fit is recorded as `skipped: budget` rather than run. A watchdog writes whatever was measured and "
             "ends the process 12 s after the deadline, should an estimate be wrong. A failure in one stage is "
             "recorded and the others still run. `--stages AC` runs some stages only. The results go to "
             "`benchmarks/results/gpu_check_<device>.json` and `.md`, and this page is rewritten from the JSON "
             "(a `--dry` run writes its page beside its JSON instead).", "",
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
