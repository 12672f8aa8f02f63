"""A sweep's children share one Inductor cache (lit/sweep/compile_cache.py): every child gets the same folder in the
sweep's own, with the FX graph and AOTAutograd caches on, before its fit; a second child's compile then loads what
the first one compiled (slow: a cold Inductor compile on CPU takes most of a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lit.sweep import child, compile_cache
from tests.conftest import REPO, subprocess_env

VARIABLES = (compile_cache.CACHE_DIR_ENV, "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")


@pytest.fixture
def clean_environment(monkeypatch):
    """The variables unset and the caches off now, all put back after the test (``use`` sets them, as a child does)."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    for name in VARIABLES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    # torch's config modules put their values back themselves (patch); monkeypatch cannot set them.
    with inductor_config.patch(fx_graph_cache=False), aot_config.patch(enable_autograd_cache=False):
        yield inductor_config, aot_config


def manifest(folder: Path) -> dict:
    return {"protocol": {"metric": "val/loss", "report_metric": "val/loss"}, "save_dir": str(folder / "runs")}


def test_every_child_fits_under_the_sweeps_one_cache(tmp_path, monkeypatch, clean_environment):
    inductor_config, aot_config = clean_environment
    seen = []

    def fake_fit(args):  # what the child's fit would compile under
        seen.append({name: os.environ.get(name) for name in VARIABLES})
        return SimpleNamespace()

    monkeypatch.setattr("lit.cli.main", fake_fit)
    client = SimpleNamespace(set_tag=lambda *a: None, set_terminated=lambda *a, **k: None)
    sweep = tmp_path / "sweeps" / "abcd1234"
    for run_id in ("first", "second"):
        assert child._fit_and_test(manifest(sweep), ["fit"], client, run_id, test=False) == 0
    expected = {compile_cache.CACHE_DIR_ENV: str(sweep / "inductor_cache"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    assert seen == [expected, expected]
    assert inductor_config.fx_graph_cache and aot_config.enable_autograd_cache  # torch read its env long before


def test_a_cache_folder_given_in_the_environment_wins(tmp_path, monkeypatch, clean_environment):
    monkeypatch.setenv(compile_cache.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert compile_cache.environment(tmp_path / "sweep")[compile_cache.CACHE_DIR_ENV] == str(tmp_path / "mine")


COMPILE_ONE_CHILD = """
import json, sys
from lit.sweep import compile_cache
compile_cache.use(sys.argv[1])
import torch
from torch._dynamo.utils import counters
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.parallel import compile_model
torch.manual_seed(0)
model = GPT(11, 8, TransformerConfig(d_model=16, n_layers=1, n_heads=2))
compile_model(model)
model(torch.randint(0, 11, (2, 8))).float().square().mean().backward()
print(json.dumps({"fx_hit": counters["inductor"]["fxgraph_cache_hit"],
                  "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
                  "aot_hit": counters["aot_autograd"]["autograd_cache_hit"]}))
"""


@pytest.mark.slow  # a cold Inductor compile of even a 1-layer model: about a minute on 2 loaded cores
def test_the_second_child_loads_the_first_childs_compiled_graphs(tmp_path):
    env = {k: v for k, v in subprocess_env().items() if k not in VARIABLES}

    def one_child() -> dict:
        done = subprocess.run([sys.executable, "-c", COMPILE_ONE_CHILD, str(tmp_path / "sweep")], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = one_child(), one_child()
    assert first["fx_hit"] == 0 and first["fx_miss"] >= 2  # the forward and the backward, compiled
    assert second["fx_miss"] == 0 and second["aot_hit"] >= 1  # loaded whole: forward and backward at once
    assert (tmp_path / "sweep" / "inductor_cache").is_dir()
