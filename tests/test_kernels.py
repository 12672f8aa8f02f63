"""The Triton kernels (arch_plugins.kernels): the dispatch rule, triton as an optional import, and correctness.

Correctness on CPU runs in Triton's interpreter, in a fresh process (tests/kernels_interpreted.py says why);
where CUDA exists the same checks (tests/kernel_checks.py) run compiled at real shapes. The fused Sinkhorn and
depth-softmax ops' registrations are checked on their torch path in tests/test_kernels_fused_ops.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from arch_plugins import registry
from arch_plugins.interfaces import Site, StackInfo
from arch_plugins.kernels import dispatch
from arch_plugins.registry import PluginError
from tests.conftest import REPO, subprocess_env

STACK = StackInfo(d_model=8, num_layers=1, num_heads=2, mlp_hidden=16, causal=True)


def test_kernels_equal_the_eager_paths_in_the_triton_interpreter():
    pytest.importorskip("triton")
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/kernels_interpreted.py", "-q", "-n", "0", "-p",
                          "no:cacheprovider"], capture_output=True, text=True, cwd=REPO, timeout=600,
                         env=subprocess_env(TRITON_INTERPRET="1"))
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout[-2000:]


def test_auto_follows_the_measured_table():
    table = {"NVIDIA H100 80GB HBM3": {"ngpt_stream_update": 1.8, "pattention_theta": 1.01}}
    assert dispatch.auto_picks_triton("ngpt_stream_update", "NVIDIA H100 80GB HBM3", table, 1.05)
    assert not dispatch.auto_picks_triton("pattention_theta", "NVIDIA H100 80GB HBM3", table, 1.05)  # within noise
    assert not dispatch.auto_picks_triton("qk_normalize", "NVIDIA H100 80GB HBM3", table, 1.05)  # not measured
    assert not dispatch.auto_picks_triton("ngpt_stream_update", "NVIDIA A100-SXM4-80GB", table, 1.05)
    assert dispatch.auto_may_pick_triton(table, 1.05)
    assert not dispatch.auto_may_pick_triton({"NVIDIA H200": {"qk_normalize": 0.57}}, 1.05)
    # As shipped, each kernel measured (an H200) is slower than torch, so auto is torch everywhere.
    assert not dispatch.auto_may_pick_triton()
    assert all(s < 1 for s in dispatch.measured.MEASURED_SPEEDUPS["NVIDIA H200"].values())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert not any(dispatch.use_triton("auto", op, torch.ones(2, 4, device=device)) for op in dispatch.OPS)


def test_triton_on_cpu_without_the_interpreter_is_one_clear_error(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    stream_site = registry.create("norm", "hypersphere", {"kernel": "triton"}).site(Site.ATTN_OUT, 8, 0, STACK)
    with pytest.raises(PluginError, match="kernel: triton runs on CUDA tensors, but row_l2_normalize got one on "
                                          "cpu; use kernel: auto") as info:
        stream_site(torch.ones(2, 8))
    assert "\n" not in str(info.value)
    with pytest.raises(PluginError, match="rows of at most 65536"):
        dispatch.use_triton("triton", dispatch.PATTENTION_THETA, torch.ones(1, 65537))
    assert not dispatch.use_triton("auto", dispatch.PATTENTION_THETA, torch.ones(1, 65537))


def test_without_triton_everything_imports_auto_runs_and_triton_says_why():
    # The plugins alone (no Lightning, no timm): this process pays for importing torch only.
    code = """
import sys
sys.modules["triton"] = None  # `import triton` now raises ImportError
import torch
from arch_plugins import registry
from arch_plugins.interfaces import ResidualHistory, Role, Site, StackInfo
stack = StackInfo(d_model=8, num_layers=1, num_heads=2, mlp_hidden=16, causal=True)
norm, residual = registry.create("norm", "hypersphere", {}), registry.create("residual", "ngpt", {})
merge, out_site, after_site = (residual.merge("attn", 0, stack), norm.site(Site.ATTN_OUT, 8, 0, stack),
                               norm.site(Site.ATTN_AFTER_ADD, 8, 0, stack))
assert merge.fuse(out_site, after_site)  # auto: the fused tail, on its torch path
h, y = merge.fused(torch.randn(3, 8), torch.randn(3, 8, requires_grad=True), ResidualHistory())
q, k = norm.qk(0, stack)(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
ffn = registry.create("projection", "pattention", {}).ffn(0, stack, bias=False, init_std=0.02)
(h.sum() + q.sum() + ffn(torch.randn(3, 8)).sum()).backward()
for kind, name, options in (("norm", "hypersphere", {}), ("residual", "ngpt", {}), ("projection", "pattention", {})):
    try:
        registry.create(kind, name, {"kernel": "triton"})
    except registry.PluginError as e:
        print("ERROR", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    errors = out.stdout.strip().splitlines()
    assert len(errors) == 3, out.stdout
    for line in errors:
        assert "kernel: triton needs the triton package, which does not import here" in line, line
        assert "use kernel: auto" in line


@pytest.mark.slow
def test_benchmark_runs_end_to_end_in_its_dry_mode():
    pytest.importorskip("triton")
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--dry", "--no_compile", "--goals"],
                         capture_output=True, text=True, cwd=REPO, timeout=900, env=subprocess_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for line in ("| ngpt_stream_update |", "| sinkhorn_knopp |", "| depth_softmax |", "| ngpt/kernels |",
                 "| mhc/kernels |", "| attnres/kernels |", "| pattention_ffn/kernels |", "ngpt_vs_gpt_step (kernels)",
                 "pattention_vs_mlp_step (kernels)", "## Verdict", "Dry run"):
        assert line in out.stdout, line


@pytest.mark.slow  # ~50 s on 2 busy cores: two interpreter start-ups, Lightning's import, one tiny model
def test_benchmark_dry_run_of_one_op_reports_its_device_time_step_and_verdict_rows():
    pytest.importorskip("triton")
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--dry", "--no_compile", "--ops",
                          "depth_softmax", "--models", "attnres"], capture_output=True, text=True, cwd=REPO,
                         timeout=600, env=subprocess_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "Clock: host time (dry run)." in lines  # on CPU: no device clock, and it says so
    op_rows = [line for line in lines if line.startswith("| depth_softmax |")]
    assert len(op_rows) == 2  # the timing row and the verdict row; no other op was asked for
    assert not any(line.startswith("| sinkhorn_knopp |") for line in lines)
    assert any(line.startswith("| attnres/eager | ") for line in lines)
    assert any(line.startswith("| attnres/kernels | ") for line in lines)
    assert op_rows[1] == "| depth_softmax | n/a | attnres | n/a | (dry run) |"  # no compile: no verdict


def test_benchmark_on_cpu_without_dry_says_it_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from benchmarks import kernels

    assert kernels.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: benchmarks/kernels.py measures Triton kernels on a CUDA GPU") and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["--ops", "row_l2_normalize,sinkhorn"], "error: argument --ops: --ops takes a comma-separated list of "
                                             "row_l2_normalize, qk_normalize"),
    (["--models", "gpt"], "error: argument --models: --models takes a comma-separated list of ngpt, tokenformer, "
                          "mhc, attnres; got 'gpt'"),
    (["--depth_sources", "0"], "error: --depth_sources must be at least 1, got 0"),
])
def test_benchmark_refuses_bad_options_in_one_line_before_any_work(argv, message, capsys, monkeypatch):
    from benchmarks import kernels

    def no_restart(*args):  # past its checks, a dry run on CPU starts over in the interpreter: not in this process
        raise AssertionError(f"the options were accepted: {argv}")

    monkeypatch.setattr(kernels.os, "execve", no_restart)
    assert kernels.main(["--dry", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_the_verdict_rule():
    """keep only at >= 1.05x against compiled torch on device time, and a compiled step no slower with the kernel.
    (The inputs are made up: this checks the rule, not a measurement.)"""
    from benchmarks.kernels import verdicts

    def row(op, vs_compile):
        return {"op": op, **({} if vs_compile is None else {"speedup_vs_compile": vs_compile})}

    steps = {"mhc/compile": {"median_s": 0.100}, "mhc/kernels+compile": {"median_s": 0.095},
             "ngpt/compile": {"median_s": 0.100}, "ngpt/kernels+compile": {"median_s": 0.104},
             "attnres/compile": {"skipped": "over the time budget (--budget_s)"}}
    got = verdicts([row("sinkhorn_knopp", 1.30), row("row_l2_normalize", 1.20), row("qk_normalize", 1.04),
                    row("depth_softmax", 1.05), row("pattention_theta", None)], steps, 1.05)
    assert {op: v["verdict"] for op, v in got.items()} == {
        "sinkhorn_knopp": "keep",  # faster alone and in its step
        "row_l2_normalize": "remove",  # faster alone, but the compiled nGPT step is slower with the kernels
        "qk_normalize": "remove",  # under 1.05x alone
        "depth_softmax": "keep",  # at 1.05x; its step was not measured (over the budget), which the row says
        "pattention_theta": "not measured"}  # no compiled torch path (--no_compile)
    assert got["sinkhorn_knopp"]["step_speedup_vs_compile"] == pytest.approx(0.100 / 0.095)
    assert got["depth_softmax"]["step_speedup_vs_compile"] is None


# --- on a GPU: compiled, at real shapes (d 1024, 512 tokens x 4, TokenFormer's FFN n = 4096) ------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available() or dispatch.interpreting(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_equal_the_eager_paths_on_cuda(dtype):
    from tests.kernel_checks import (
        check_ngpt_stream_update,
        check_pattention_theta,
        check_qk_normalize,
        check_row_l2_normalize,
    )

    check_row_l2_normalize((4, 512, 1024), dtype, "cuda")
    check_qk_normalize(4, 16, 512, 64, dtype, "cuda")
    check_ngpt_stream_update((4, 512, 1024), torch.float32, dtype, "cuda")  # the fp32 stream, bf16 branch
    check_ngpt_stream_update((4, 512, 1024), torch.float32, dtype, "cuda", branch_grad=False)
    check_pattention_theta((4, 512, 4096), dtype, "cuda")


@cuda
def test_ngpt_and_tokenformer_models_with_kernels_equal_torch_on_cuda():
    from lit.models import GPT, TransformerConfig

    def run(arch, kernel_key, kernel):
        options = {k: ({**v, "kernel": kernel}) for k, v in kernel_key.items()}
        torch.manual_seed(0)
        model = GPT(97, 256, TransformerConfig(**arch, **options)).cuda()
        idx = torch.randint(0, 97, (4, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
        logits.float().logsumexp(-1).mean().backward()
        return logits.float(), [p.grad.float() for p in model.parameters()]

    common = dict(d_model=256, n_layers=2, n_heads=4)
    for arch, keys in ((dict(common, norm="hypersphere", residual="ngpt"), {"norm_options": {},
                                                                            "residual_options": {}}),
                       (dict(common, projection="pattention"), {"projection_options": {}})):
        (ref, ref_grads), (got, got_grads) = run(arch, keys, "torch"), run(arch, keys, "triton")
        torch.testing.assert_close(got, ref, rtol=0, atol=2 ** -6 * ref.abs().max().item())
        for g_ref, g_got in zip(ref_grads, got_grads, strict=True):
            torch.testing.assert_close(g_got, g_ref, rtol=0, atol=2 ** -5 * g_ref.abs().max().item() + 1e-6)


@cuda
def test_fused_sinkhorn_and_depth_softmax_equal_the_torch_paths_on_cuda():
    from tests.kernel_checks import check_depth_softmax, check_sinkhorn_knopp

    check_sinkhorn_knopp((4, 512), 4, iters=20, device="cuda")  # the paper's n and iterations
    check_sinkhorn_knopp((4, 512), 3, iters=20, device="cuda")  # padded to 4 x 4
    check_depth_softmax((4, 512, 1024), [torch.float32] * 9, 1e-6, device="cuda")
    # Under autocast: the fp32 embedding and bf16 sublayer outputs; no key norm.
    check_depth_softmax((4, 512, 1024), [torch.float32] + [torch.bfloat16] * 8, 1e-6, device="cuda")
    check_depth_softmax((4, 512, 1024), [torch.bfloat16] * 9, None, device="cuda")


@cuda
@pytest.mark.parametrize("residual", ["mhc", "attnres", "attnres_block"])
def test_residual_models_with_fused_ops_equal_torch_on_cuda(residual):
    from lit.models import GPT, TransformerConfig

    def run(kernel):
        options = {"gating_init": 0.5} if residual == "mhc" else {}  # H_res depends on the tokens
        torch.manual_seed(0)
        model = GPT(97, 256, TransformerConfig(d_model=256, n_layers=2, n_heads=4, residual=residual,
                                               residual_options={**options, "kernel": kernel})).cuda()
        idx = torch.randint(0, 97, (4, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
        logits.float().logsumexp(-1).mean().backward()
        return logits.float(), [p.grad.float() for p in model.parameters()]

    (ref, ref_grads), (got, got_grads) = run("torch"), run("triton")
    torch.testing.assert_close(got, ref, rtol=0, atol=2 ** -6 * ref.abs().max().item())
    for g_ref, g_got in zip(ref_grads, got_grads, strict=True):
        torch.testing.assert_close(g_got, g_ref, rtol=0, atol=2 ** -5 * g_ref.abs().max().item() + 1e-6)
