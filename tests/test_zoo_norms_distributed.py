"""PRepBN's, UN's and PowerNorm's synchronised batch statistics and BHyT's refresh under DDP, 2 gloo processes
(zoo_norms_worker.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests import zoo_norms_worker as worker
from tests.conftest import REPO, free_port, subprocess_env


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo_ddp")
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "zoo_norms_worker.py"), "--out", str(out),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_prepbn_statistics_are_the_global_batchs_on_every_rank(ranks):
    single = worker.train("prepbn")
    stats = [k for k in single if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 10  # 2 blocks x 2 sites + the final norm
    moved = max((single[k] - worker.build("prepbn").state_dict()[k]).abs().max().item() for k in single)
    assert moved > 0.05
    for rank in ranks:
        for key, expected in single.items():  # statistics and weights both: the gradients went through them too
            torch.testing.assert_close(rank["prepbn"][key], expected, atol=1e-5, rtol=1e-4, msg=key)


def test_unsynchronised_statistics_would_differ(ranks):
    # The check above can fail: rank 0's own half of the last batch has other statistics than the whole batch.
    tokens = worker.global_batches()[-1][:2, :-1]
    model = worker.build("prepbn")
    site = model.stack.blocks[0].attn_in
    x = []
    site.register_forward_pre_hook(lambda m, a: x.append(a[0]))
    model(tokens)
    local_mean = x[0].reshape(-1, 16).mean(0)
    model(worker.global_batches()[-1][:, :-1])
    assert (x[1].reshape(-1, 16).mean(0) - local_mean).abs().max() > 1e-3


def test_bhyt_refresh_gives_every_rank_the_single_process_c_attn(ranks):
    single = worker.train("bhyt")
    keys = [k for k in single if k.endswith("c_attn")]
    assert len(keys) == 2 and all(single[k] > 0 for k in keys)
    for key in single:
        torch.testing.assert_close(ranks[0]["bhyt"][key], ranks[1]["bhyt"][key], atol=0, rtol=0, msg=key)
        torch.testing.assert_close(ranks[0]["bhyt"][key], single[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("kind, buffers", [("un", ("running_var", "ema_gz", "buffer_x2", "buffer_gz")),
                                           ("powernorm", ("running_phi", "ema_gz"))])
def test_un_and_powernorm_statistics_are_the_global_batchs_on_every_rank(ranks, kind, buffers):
    """Forward statistics and the approximate backward's (ema_gz) both: each rank equals one process on the whole
    batch, weights included."""
    single = worker.train(kind)
    stats = [k for k in single if k.endswith(buffers)]
    assert len(stats) == 5 * len(buffers)  # 2 blocks x 2 sites + the final norm
    initial = worker.build(kind).state_dict()
    assert max((single[k].float() - initial[k].float()).abs().max().item() for k in stats) > 0.05
    for rank in ranks:
        for key, expected in single.items():
            torch.testing.assert_close(rank[kind][key], expected, atol=1e-5, rtol=1e-4, msg=key)
