"""Muon's batched step (issue 43, item 3) equals the per-parameter step it replaced, on one process and on two.

The matrices of one shape are now stacked and orthogonalised in one batched Newton-Schulz call
(arch_plugins/optimizers/shape_groups.py), and with several processes each orthogonalises a share of every group.
The reference below is the per-parameter step as it was before the rewrite. Newton-Schulz runs in bf16, and a
batched product may round differently from the per-matrix one, so the weights agree within bf16 rounding of the
step (tolerance beside each assert); the momentum buffers, which are fp32 and element-wise, agree exactly.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

from arch_plugins.optimizers import shape_groups
from arch_plugins.optimizers.muon import ADJUST_LR, MuonWithAdamW, is_sharded, local_box
from tests import muon_sharded_worker
from tests.conftest import REPO, subprocess_env

# --- the reference: the pre-rewrite version, from commit 6f28ed3 (arch_plugins/optimizers/muon.py and
# newton_schulz.py), one Newton-Schulz call per logical matrix ----------------------------------------------------

def reference_orthogonalize(grad: torch.Tensor, coefficients=(3.4445, -4.7750, 2.0315), steps: int = 5,
                            eps: float = 1e-7) -> torch.Tensor:
    if grad.ndim != 2:
        raise ValueError(f"Newton-Schulz orthogonalises a matrix; got a tensor of shape {tuple(grad.shape)}")
    a, b, c = coefficients
    tall = grad.shape[0] > grad.shape[1]
    x = grad.to(dtype=torch.bfloat16, copy=True)
    if tall:  # iterate on the wide orientation: the Gram matrix is the smaller one
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class ReferenceMuonWithAdamW(torch.optim.AdamW):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        everything = self.param_groups
        try:  # AdamW's own step, over the AdamW groups only
            self.param_groups = [g for g in everything if not g.get("muon", False)]
            super().step()
        finally:
            self.param_groups = everything
        for group in everything:
            if group.get("muon", False):
                self._muon_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
        adjust = ADJUST_LR[group["adjust_lr"]]
        for param, slices in zip(group["params"], group["slices"], strict=True):
            if param.grad is None:
                continue
            grad = param.grad
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                state["step"] = torch.tensor(0.0)
            state["step"] += 1
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - momentum)
            update = grad.lerp(buf, momentum) if group["nesterov"] else buf
            sharded = is_sharded(param)
            if sharded:
                update = update.full_tensor()
            parts = [(start, stop, reference_orthogonalize(update[start:stop], steps=group["ns_steps"]))
                     for start, stop in slices]
            param.mul_(1 - lr * wd)
            if not sharded:
                for start, stop, orthogonal in parts:
                    param[start:stop].add_(orthogonal, alpha=-lr * adjust(stop - start, param.shape[1]))
                continue
            local, (rows, cols) = param.to_local(), local_box(param)
            for start, stop, orthogonal in parts:
                first, last = max(start, rows.start), min(stop, rows.stop)
                if first < last:
                    local[first - rows.start:last - rows.start].add_(
                        orthogonal[first - start:last - start, cols], alpha=-lr * adjust(stop - start, param.shape[1]))


# --- one process ----------------------------------------------------------------------------------------------------

# (rows, columns), logical row slices, Muon group (0 or 1): a fused q|k|v, an attention output, a fused value|gate
# (tall parts that join the MLP output's wide group), a GQA-like q|k|v with smaller k and v, and a lone odd shape.
MATRICES = [((48, 16), [(0, 16), (16, 32), (32, 48)], 0), ((16, 16), [(0, 16)], 0),
            ((64, 16), [(0, 32), (32, 64)], 0), ((16, 32), [(0, 16)], 1),
            ((32, 16), [(0, 16), (16, 24), (24, 32)], 1), ((5, 7), [(0, 5)], 1)]
STEPS = 4
GROUP_OPTIONS = [{"lr": 0.05, "weight_decay": 0.1, "momentum": 0.95},
                 {"lr": 0.02, "weight_decay": 0.0, "momentum": 0.9}]


def run(optimizer_class, adjust_lr: str, nesterov: bool, ns_steps: tuple[int, int]):
    """The weights and momentum buffers after ``STEPS`` steps of fixed gradients (so that the two versions see the
    same gradients whatever their weights), with an AdamW parameter in the same optimizer."""
    g = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.randn(shape, generator=g)) for shape, _, _ in MATRICES]
    adam = nn.Parameter(torch.randn(3, 5, generator=g))
    groups = [{"params": [p for p, (_, _, i) in zip(params, MATRICES, strict=True) if i == which], "muon": True,
               "slices": [slices for _, slices, i in MATRICES if i == which], "nesterov": nesterov,
               "ns_steps": ns_steps[which], "adjust_lr": adjust_lr, **GROUP_OPTIONS[which]} for which in (0, 1)]
    opt = optimizer_class([*groups, {"params": [adam], "muon": False, "lr": 0.01, "weight_decay": 0.1}],
                          lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(STEPS):
        for p in (*params, adam):
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach().clone() for p in (*params, adam)], [opt.state[p]["momentum_buffer"].clone() for p in params]


def step_tolerance(adjust_lr: str) -> float:
    """Weights after ``STEPS`` steps agree to a few bf16 roundings of each step: an orthogonalised entry is below 1
    and bf16 keeps 8 bits (2^-8 relative), so 4 flipped last bits per step of at most lr * adjustment. On a CPU
    the batched products measured bit for bit equal to the per-matrix ones (max abs diff 0); a GPU's batched GEMM
    kernels may accumulate in another order."""
    largest_step = max(o["lr"] for o in GROUP_OPTIONS) * max(
        ADJUST_LR[adjust_lr](min(a, b), max(a, b)) for (a, b), _, _ in MATRICES)
    return STEPS * largest_step * 4 * 2 ** -8


@pytest.mark.parametrize("adjust_lr", sorted(ADJUST_LR))
@pytest.mark.parametrize("nesterov", [True, False])
def test_the_batched_step_equals_the_per_parameter_step(adjust_lr, nesterov):
    # ns_steps differ between the groups: matrices of one shape but not of one step count are not stacked together.
    ours, ours_momentum = run(MuonWithAdamW, adjust_lr, nesterov, (5, 3))
    reference, reference_momentum = run(ReferenceMuonWithAdamW, adjust_lr, nesterov, (5, 3))
    for got, expected in zip(ours_momentum, reference_momentum, strict=True):
        assert torch.equal(got, expected)  # momentum is element-wise fp32: the same bits
    for got, expected in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, expected, atol=step_tolerance(adjust_lr), rtol=0)


def test_matrices_of_one_shape_are_orthogonalised_in_one_call(monkeypatch):
    calls = []
    original = shape_groups.orthogonalize_stack

    def recording(stack, *args, steps, **kwargs):
        calls.append((tuple(stack.shape), steps))
        return original(stack, *args, steps=steps, **kwargs)

    monkeypatch.setattr(shape_groups, "orthogonalize_stack", recording)
    run(MuonWithAdamW, "original", True, (5, 3))
    # Per step: group 0's q, k, v and output (16, 16); its value and gate transposed to the wide (16, 32); group 1's
    # output (16, 32) and GQA q (16, 16) apart from group 0's (3 steps, not 5), its k and v (8, 16), the odd (5, 7).
    expected = {((4, 16, 16), 5), ((2, 16, 32), 5), ((1, 16, 32), 3), ((1, 16, 16), 3), ((2, 8, 16), 3),
                ((1, 5, 7), 3)}
    assert len(calls) == STEPS * len(expected) and set(calls) == expected


# --- two processes --------------------------------------------------------------------------------------------------

def test_two_simulated_processes_share_each_shape_group_and_step_as_one(monkeypatch):
    """The split among processes, quickly: two threads play the two ranks of tests/muon_sharded_worker.py's problem
    on whole tensors, with an in-memory all-gather; each orthogonalises its share and both end with the weights of
    one process. The real 2-process run (gloo, also on DTensor shards) is the slow test below."""
    world, barrier, inputs, counts = 2, threading.Barrier(2, timeout=60), {}, {0: 0, 1: 0}
    rank_of = threading.local()

    def all_gather(output, tensor, group=None, async_op=False):
        inputs[rank_of.rank] = tensor.clone()
        barrier.wait()  # both ranks' shares in
        torch.cat([inputs[r] for r in range(world)], out=output)
        barrier.wait()  # both read before the next group overwrites

    original = shape_groups.orthogonalize_stack

    def counting(stack, *args, **kwargs):
        counts[rank_of.rank] += stack.shape[0]
        return original(stack, *args, **kwargs)

    monkeypatch.setattr(shape_groups, "processes", lambda: (rank_of.rank, world))
    monkeypatch.setattr(torch.distributed, "all_gather_single", all_gather, raising=False)
    monkeypatch.setattr(shape_groups, "orthogonalize_stack", counting)
    results, failures = {}, []

    def play(rank):
        rank_of.rank = rank
        try:
            results[rank] = muon_sharded_worker.train()
        except BaseException as exc:  # noqa: BLE001 (reported below; the other thread must not wait forever)
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=play, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    monkeypatch.undo()
    # Shape groups per step: (3, 6) (6, 6) (4, 5) (1, 3) (4, 7) alone, (4, 4) x 4 and (4, 8) x 3; split 2 ways
    # rank 0 takes 1, 1, 1, 1, 1, 2, 2 matrices and rank 1 takes 0, 0, 0, 0, 0, 2, 1 (SPLIT).
    assert counts == {rank: muon_sharded_worker.STEPS * SPLIT[rank] for rank in range(world)}
    single = muon_sharded_worker.train()
    for rank in range(world):
        for got, expected in zip(results[rank], single, strict=True):
            assert torch.equal(got, expected)  # the same products on a share as on the whole stack


SPLIT = {0: 9, 1: 3}  # matrices per step each of 2 processes orthogonalises in tests/muon_sharded_worker.py


@pytest.mark.slow  # ~15 s of CPU, measured 60 s wall on 2 loaded cores; the simulated test above is the quick check
def test_two_processes_share_each_shape_group_and_step_as_one(tmp_path):
    """tests/muon_split_worker.py on 2 gloo processes: on whole tensors (DDP) and on DTensor shards (FSDP2), each
    process orthogonalises a share of each shape group and the weights are those of one process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "split.pt"
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "muon_split_worker.py"), "--out", str(out)],
                              cwd=tmp_path, env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    errors = [proc.communicate(timeout=240)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors[0][-3000:] + errors[1][-3000:]
    ranks = [torch.load(f"{out}.rank{rank}") for rank in range(2)]

    for run in ("whole", "sharded"):
        counts = [r[f"{run}_count"] for r in ranks]
        assert counts == [muon_sharded_worker.STEPS * SPLIT[rank] for rank in range(2)], (run, counts)
        for got, other in zip(ranks[0][run], ranks[1][run], strict=True):
            assert torch.equal(got, other)  # every process applied the same gathered bits: no drift

    single = muon_sharded_worker.train()
    initial, _ = muon_sharded_worker.problem()
    assert min((w - i).abs().max().item() for w, i in zip(single, initial, strict=True)) > 0.02  # it trained
    for run in ("whole", "sharded"):
        for got, expected in zip(ranks[0][run], single, strict=True):
            # The same batched products on each process's share as on the whole stack: measured bit for bit.
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    # And within bf16 rounding of the per-parameter version: 4 flipped bf16 last bits of each of the 3 steps of at
    # most lr 0.05 x adjustment sqrt(16 / 4) = 2 (the problem's largest, "original").
    reference = muon_sharded_worker.train(optimizer_class=ReferenceMuonWithAdamW)
    for got, expected in zip(ranks[0]["whole"], reference, strict=True):
        torch.testing.assert_close(got, expected, atol=muon_sharded_worker.STEPS * 0.05 * 2 * 4 * 2 ** -8, rtol=0)
