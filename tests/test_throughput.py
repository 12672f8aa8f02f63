"""Throughput over the log window, MFU against the device's spec-sheet peak, and the GPU-only settings (TF32, fused
AdamW, pinned batches) that must leave a CPU run exactly as it was."""

from __future__ import annotations

from types import SimpleNamespace

import mlflow
import pytest
import torch

from arch_plugins.optimizers.adamw import AdamWOptimizer
from lit import throughput
from lit.cli import main
from lit.data.text import TextDataModule
from lit.device_peaks import peak_bandwidth, peak_flops
from lit.matmul_precision import allow_tf32
from lit.throughput import ThroughputWindow, device_peak, mfu
from tests.conftest import REPO, TINY_LM

H100 = "NVIDIA H100 80GB HBM3"  # what torch.cuda.get_device_name reports for an H100 SXM


def test_the_window_rate_is_items_since_the_last_read_over_the_time_since_then():
    now = [0.0]
    window = ThroughputWindow(clock=lambda: now[0])
    assert window.read() is None  # no window open yet
    window.start()
    for t in (0.5, 1.0, 4.0):  # uneven steps: the window's mean, not the last step's rate (100 / 3 s)
        now[0] = t
        window.add(100)
    assert window.read() == pytest.approx(300 / 4.0)
    now[0] = 6.0
    window.add(50)
    assert window.read() == pytest.approx(50 / 2.0)  # the next window starts where the last one was read
    window.add(10)
    window.drop()  # validation: its time and the items before it are not counted
    now[0] = 100.0
    window.add(10)
    assert window.read() is None
    window.start()
    now[0] = 101.0
    window.add(20)
    assert window.read() == pytest.approx(20.0)


def test_peaks_match_the_names_cuda_reports_and_are_none_where_unknown():
    assert peak_flops(H100, torch.bfloat16) == peak_flops(H100, torch.float16) == 989.5e12
    assert peak_flops(H100, torch.float32, tf32=True) == 494.5e12
    assert peak_flops(H100, torch.float32, tf32=False) == 67e12
    assert peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756.5e12
    assert peak_flops("NVIDIA H100 NVL", torch.bfloat16) == 835.5e12
    assert peak_flops("NVIDIA H200", torch.bfloat16) == 989.5e12 and peak_bandwidth("NVIDIA H200") == 4.8e12
    # Names that contain one another: A100 is no A10, L40S no L4, and the 40 GB A100 has its own bandwidth.
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.bfloat16) == 312e12
    assert peak_bandwidth("NVIDIA A100-SXM4-40GB") == 1.555e12 and peak_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039e12
    assert peak_flops("NVIDIA A10", torch.bfloat16) == 125e12 and peak_flops("NVIDIA A10G", torch.bfloat16) == 70e12
    assert peak_flops("NVIDIA L40S", torch.bfloat16) == 362.05e12 and peak_flops("NVIDIA L4", torch.bfloat16) == 121e12
    assert peak_flops("cpu", torch.float32) is None and peak_bandwidth("NVIDIA GeForce RTX 4090") is None
    assert peak_flops(H100, torch.float64) is None
    # Left to torch's setting, float32's peak is the one its matrix products actually use.
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert peak_flops(H100, torch.float32) == 494.5e12
        torch.set_float32_matmul_precision("highest")
        assert peak_flops(H100, torch.float32) == 67e12
    finally:
        torch.set_float32_matmul_precision(before)


def test_mfu_is_achieved_flops_per_device_over_the_peak_for_the_runs_dtype(monkeypatch):
    assert mfu(6e9, 1e5, devices=2, peak=1e15) == pytest.approx(6e9 * 1e5 / 2 / 1e15)
    monkeypatch.setattr(throughput, "device_name", lambda device: H100)
    assert device_peak(torch.device("cuda"), "bf16-mixed") == 989.5e12
    assert device_peak(torch.device("cuda"), "64-true") is None
    monkeypatch.undo()
    assert device_peak(torch.device("cpu"), "bf16-mixed") is None  # a CPU has no table entry: no train/mfu


def test_a_fit_logs_window_throughput_and_mfu_at_log_steps_only(workdir_with_store, monkeypatch):
    monkeypatch.setattr(throughput, "device_name", lambda device: H100)  # as if on an H100: fp32 -> 67 TFLOP/s
    main(["fit", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *TINY_LM, "--trainer.max_steps=20",
          "--trainer.val_check_interval=null", "--trainer.limit_val_batches=0", "--checkpoint.every_n_train_steps=0"])
    client = mlflow.MlflowClient(f"sqlite:///{workdir_with_store}/mlflow.db")
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    history = {name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
               for name in ("train/tokens_per_s", "train/mfu", "train/lr", "train/flops", "train/loss")}
    for name, values in history.items():
        assert sorted(values) == [9, 19], (name, values)  # the recipe logs every 10 steps
    per_token = run.data.metrics["model/flops_per_token"]
    assert torch.get_float32_matmul_precision() == "highest"  # on a CPU nothing changed it
    for step, rate in history["train/tokens_per_s"].items():
        assert history["train/mfu"][step] == pytest.approx(per_token * rate / 67e12, rel=1e-5)


def test_tf32_is_allowed_for_fp32_runs_on_cuda_only_and_a_users_setting_is_kept():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert not allow_tf32("32-true", torch.device("cpu"))
        assert not allow_tf32("bf16-mixed", torch.device("cuda"))
        assert torch.get_float32_matmul_precision() == "highest"
        assert allow_tf32("32-true", torch.device("cuda"))
        assert torch.get_float32_matmul_precision() == "high"
        torch.set_float32_matmul_precision("medium")  # the user's own choice
        assert not allow_tf32("32-true", torch.device("cuda"))
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_adamw_is_fused_where_asked_and_unchanged_on_a_cpu():
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))

    def train(optimizer, m):
        for i in range(3):
            torch.manual_seed(i)
            m(torch.randn(4, 8)).square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in m.parameters()]

    m, n = model(), model()
    auto = AdamWOptimizer().build(m, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
    assert not auto.defaults["fused"] and auto.defaults["foreach"] is None  # torch's CPU default, as before
    plain = torch.optim.AdamW([{"params": [p for p in n.parameters() if p.dim() > 1], "weight_decay": 0.1},
                               {"params": [p for p in n.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    assert all(torch.equal(a, b) for a, b in zip(train(auto, m), train(plain, n), strict=True))  # bit-identical
    fused = AdamWOptimizer(fused=True).build(model(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
    assert fused.defaults["fused"]


def test_text_batches_are_pinned_when_training_on_cuda_only():
    data = TextDataModule(block_size=16, batch_size=2)
    data.setup("fit")
    assert not data.val_dataloader().pin_memory  # no trainer here and no GPU
    data.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    assert data.val_dataloader().pin_memory
    data.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")))
    assert not data.val_dataloader().pin_memory
