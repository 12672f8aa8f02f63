"""The example third-party plugin (examples/scalenorm_plugin) works by name, as a real distribution.

Nothing is pip-installed: a ``.dist-info`` folder whose ``entry_points.txt`` is generated from the
example's own ``pyproject.toml`` is put on ``sys.path`` next to the example's ``src`` folder, which is
exactly what ``importlib.metadata`` sees after ``pip install examples/scalenorm_plugin``. So these
tests check the real packaging (distribution name, version, entry point), not a hand-written copy.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from arch_plugins import catalogue, registry
from tests.conftest import subprocess_env, write_distribution

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the stdlib has no TOML reader
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "examples" / "scalenorm_plugin"
PYPROJECT = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())
RECIPE = REPO / "recipes" / "gpt_baseline.yaml"


def fake_install(site: Path) -> dict:
    """Write the .dist-info that `pip install examples/scalenorm_plugin` leaves in ``site``."""
    project = PYPROJECT["project"]
    dist_info = write_distribution(site, project["name"], project["version"], project["entry-points"])
    (dist_info / "top_level.txt").write_text("scalenorm_plugin\n")
    return project


@pytest.fixture
def installed(tmp_path_factory):
    """Make arch-lab-scalenorm visible as an installed distribution for the duration of one test."""
    site = tmp_path_factory.mktemp("site-packages")
    project = fake_install(site)

    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(PLUGIN_DIR / "src"))
        mp.syspath_prepend(str(site))
        importlib.invalidate_caches()
        yield project
        registry.unregister("norm", "scalenorm")
    # sys.path is restored: forget the plugin's modules and the finders' view of the removed folders.
    for name in set(sys.modules) - before:
        if name == "scalenorm_plugin" or name.startswith("scalenorm_plugin."):
            del sys.modules[name]
    importlib.invalidate_caches()


def test_pyproject_declares_the_entry_point():
    project = PYPROJECT["project"]
    assert project["name"] == "arch-lab-scalenorm"
    assert project["version"] == "0.1.0"
    assert project["entry-points"]["arch_plugins.norm"] == {
        "scalenorm": "scalenorm_plugin.norm:ScaleNormStrategy"}
    # Only torch: depending on arch-lab (not on an index) would make `pip install` fail.
    assert [d.split(">")[0].split("=")[0].strip() for d in project["dependencies"]] == ["torch"]


def test_registered_by_name_from_its_own_distribution(installed):
    assert "scalenorm" in registry.names("norm")
    spec = registry.spec("norm", "scalenorm")
    assert spec.package == "arch-lab-scalenorm"
    assert spec.version == "0.1.0"
    assert spec.target == "scalenorm_plugin.norm:ScaleNormStrategy"
    assert catalogue.summary(registry.spec("norm", "scalenorm")).startswith("Pre-norm with ScaleNorm")
    # Built-ins are still there, from the main package.
    assert registry.spec("norm", "rmsnorm").package == "arch-lab"


def test_scalenorm_formula_and_init(installed):
    from scalenorm_plugin.norm import ScaleNorm, ScaleNormStrategy

    from arch_plugins.interfaces import Site, StackInfo

    d = 48
    norm = registry.create("norm", "scalenorm", {"eps": 1e-5})
    assert isinstance(norm, ScaleNormStrategy)
    stack = StackInfo(d_model=d, num_layers=2, num_heads=4, mlp_hidden=128, causal=True)
    sites = {s: norm.site(s, d, 0, stack) for s in Site.BLOCK}
    sites.update({s: norm.site(s, d, None, stack) for s in Site.MODEL})
    assert {s for s, m in sites.items() if m is not None} == {Site.ATTN_IN, Site.MLP_IN, Site.FINAL}

    module = sites[Site.ATTN_IN]
    assert isinstance(module, ScaleNorm)
    assert isinstance(module.g, torch.nn.Parameter) and module.g.numel() == 1
    assert module.g.item() == pytest.approx(math.sqrt(d))
    from arch_plugins.declarations import parameter_roles

    assert [(r.role, r.kind) for r in parameter_roles(module)] == [("scalar", "scalar")]  # it declares its role

    torch.manual_seed(0)
    x = torch.randn(3, 5, d) * 7.0
    with torch.no_grad():
        module.g.fill_(2.5)
    expected = 2.5 * x / x.pow(2).sum(-1, keepdim=True).sqrt()
    torch.testing.assert_close(module(x), expected)
    # At init (g = sqrt(d)) every row has unit RMS, whatever its scale.
    fresh = ScaleNorm(d)
    rms = fresh(x).pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-5, atol=1e-5)
    # eps floors the norm: a zero row stays finite (zero).
    assert torch.equal(fresh(torch.zeros(2, d)), torch.zeros(2, d))
    # Gradients reach g.
    fresh(x).sum().backward()
    assert fresh.g.grad is not None

    frozen = registry.create("norm", "scalenorm", {"learnable": False}).make_norm(d)
    assert "g" in dict(frozen.named_buffers()) and not list(frozen.parameters())
    assert frozen.g.item() == pytest.approx(math.sqrt(d))

    with pytest.raises(registry.PluginError, match="did you mean 'eps'"):
        registry.create("norm", "scalenorm", {"epsilon": 1e-6})


def test_trains_by_name_from_the_cli(installed, tmp_path, monkeypatch):
    from scalenorm_plugin.norm import ScaleNorm

    from lit.cli import main
    from lit.models import GPT, TransformerConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["cli.py"])  # pytest's own arguments are not the CLI's
    cli = main(["fit", "--config", str(RECIPE), "--model.arch.norm=scalenorm", "--model.arch.d_model=32",
          "--model.arch.n_layers=1", "--data.block_size=32", "--data.batch_size=4",
          "--trainer.fast_dev_run=true", "--trainer.logger=false", "--trainer.enable_progress_bar=false"])
    stack = cli.model.model.stack
    used = {(s.kind, s.name): s for s in stack.plugin_specs}
    assert used[("norm", "scalenorm")].origin == "arch-lab-scalenorm==0.1.0"
    assert isinstance(stack.blocks[0].attn_in, ScaleNorm)

    model = GPT(vocab_size=65, block_size=32,
                arch=TransformerConfig(d_model=32, n_layers=1, n_heads=4, norm="scalenorm"))
    block = model.stack.blocks[0]
    assert isinstance(block.attn_in, ScaleNorm)
    assert isinstance(block.mlp_in, ScaleNorm)
    assert isinstance(model.stack.final, ScaleNorm)
    assert model(torch.randint(0, 65, (2, 32))).shape == (2, 32, 65)


def test_listed_by_cli_plugins(installed, capsys):
    from lit.plugins_command import main as plugins

    assert plugins([]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    row = next(r for r in rows if len(r) > 1 and r[1] == "scalenorm")
    assert row[:4] == ["norm", "scalenorm", "arch-lab-scalenorm", "0.1.0"]
    assert " ".join(row[4:]).startswith("Pre-norm with ScaleNorm")


def test_its_own_tests_run_the_conformance_kit(tmp_path):
    """The example's tests (examples/scalenorm_plugin/tests), as its author runs them once it is installed (the kit
    finds arch-lab's stacks through arch-lab's installed entry points, as it would for them)."""
    site = tmp_path / "site-packages"
    site.mkdir()
    fake_install(site)
    path = os.pathsep.join([str(site), str(PLUGIN_DIR / "src"), str(REPO)])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(PLUGIN_DIR),
                           str(PLUGIN_DIR / "tests")], capture_output=True, text=True, timeout=600, cwd=PLUGIN_DIR,
                          env=subprocess_env(PYTHONPATH=path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # 8 checks, twice (two option sets): the init identity holds, only `distributed` does not apply (no state).
    assert "14 passed, 2 skipped" in proc.stdout, proc.stdout[-2000:]


def test_gone_without_the_distribution():
    """The fixture leaves nothing behind (unless the example really is pip-installed here)."""
    try:
        metadata.distribution("arch-lab-scalenorm")
    except metadata.PackageNotFoundError:
        assert "scalenorm" not in registry.names("norm")
        assert "scalenorm_plugin" not in sys.modules
    else:
        pytest.skip("arch-lab-scalenorm is installed in this environment")
