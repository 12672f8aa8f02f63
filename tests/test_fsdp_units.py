"""FSDP2's units (lit/parallel.py ``shard``): each block, the embedding, and the readout (final norm, head, logits
site) on their own, the last block and the readout kept gathered after forward; the chunked training loss through
them equals the unsharded whole-logits loss, also after a forward without gradients (validation) between steps.

The work runs in tests/fsdp_units_worker.py (a process group of its own): one process by default, two with
``-m slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, subprocess_env

BLOCK = ["attn.out.weight", "attn.qkv.weight", "attn_in.weight", "mlp.down.weight", "mlp.up.weight", "mlp_in.weight"]


def run_worker(world: int, tmp_path) -> dict:
    out = tmp_path / "units.json"
    done = subprocess.run([sys.executable, str(REPO / "tests" / "fsdp_units_worker.py"), str(out), str(world)],
                          capture_output=True, text=True, cwd=REPO, timeout=600, env=subprocess_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def expected_layout(tied: bool) -> dict:
    blocks = {f"stack.blocks.{i}": {"reshard_after_forward": i < 2,  # the last block stays gathered for backward
                                    "parameters": [f"stack.blocks.{i}.{name}" for name in BLOCK]} for i in range(3)}
    if tied:  # one parameter at both ends: embedding and head stay in the root
        return {"(root)": {"reshard_after_forward": True, "parameters": ["stack.final.weight", "tok.weight"]},
                **blocks}
    return {"(root)": {"reshard_after_forward": False, "parameters": []},
            "tok": {"reshard_after_forward": True, "parameters": ["tok.weight"]}, **blocks,
            "stack.final,head,logits": {"reshard_after_forward": False,
                                        "parameters": ["head.weight", "stack.final.weight"]}}


def check(report: dict) -> None:
    for tied in (False, True):
        entry = report[f"tied={tied}"]
        assert entry["units"] == expected_layout(tied)
        assert entry["max_grad_error"] < 1e-5 and entry["max_loss_error"] < 1e-5 and entry["eval_error"] < 1e-5, entry


def test_units_and_the_chunked_loss_through_them_on_one_process(tmp_path):
    check(run_worker(1, tmp_path))


@pytest.mark.slow
def test_units_and_the_chunked_loss_through_them_on_two_processes(tmp_path):
    check(run_worker(2, tmp_path))
