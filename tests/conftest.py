"""Shared fixtures: fake installed distributions, an isolated working directory, tiny configs."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The default run is spread over 3 pytest-xdist workers (pyproject.toml's addopts), one file per worker at a time.
# Each worker computes on one thread, as the CLI processes the tests start already do (subprocess_env): workers of
# two threads each on 2 cores only contend. Set before any test module imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The files that take longest (over 35 s, measured with the whole default run on 3 workers, 2026-12-02), longest
# first. xdist hands out the files with the most tests first; these go before them, so that the last file a worker
# runs is a short one and no worker waits alone at the end (a file holding 2-process tests ran alone for 100 s).
LONGEST_FIRST = ("test_sweep.py", "test_resume.py", "test_recipes.py", "test_sharded_checkpoints.py",
                 "test_distributed.py", "test_coord_check.py", "test_gpu_check.py", "test_diagnostics.py",
                 "test_overlays.py", "test_tracking.py", "test_kernels.py", "test_tracking_distributed.py",
                 "test_compare.py", "test_tracking_faults.py", "test_scaling.py", "test_compile_graphs.py",
                 "test_every_plugin.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            if not getattr(self, "_reordered", False):
                rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
                files = sorted(self.workqueue, key=lambda f: rank.get(Path(f).name, len(rank)))
                self.workqueue.update((f, self.workqueue.pop(f)) for f in files)
                self._reordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.fixture(autouse=True)
def _cli_parser_built_once():
    """The CLI's parser is built once per test process and reused by every in-process run, as a sweep worker reuses
    it over its runs (``lit.cli.reuse_parsers``): building it resolves every class signature again, about 0.7 s of
    CPU per run on 2 cores, over hundreds of runs. A fresh parser is still what every CLI process the tests start
    builds. Only once lit.cli is imported: a test that checks what a bare import pulls in sees nothing of this."""
    cli = sys.modules.get("lit.cli")
    if cli is not None:
        cli.reuse_parsers()
    yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI run in child processes: one thread each (2 cores), this checkout importable
    (tests/fault_injection.py), and no tracking URI or rank of this process leaking in."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "LOCAL_RANK", "NODE_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    """``cli.py ARGV`` in this process: exit code, stdout, stderr."""
    from lit.commands import main

    try:
        code = main(argv) or 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_here(argv: list[str], cwd: Path, env: dict[str, str] | None = None):
    """``cli.py ARGV`` run in this process as ``subprocess.run`` runs it in a child, for a command that needs no
    process of its own (each child spends seconds importing Lightning): in ``cwd``, in the child's environment
    (``subprocess_env()`` unless given) and on one thread, as the child computes. Returns what ``subprocess.run``
    would: the exit code, what was printed, and the warnings issued written into stderr, as a child prints them."""
    import contextlib
    import io
    import subprocess
    import warnings

    import torch

    from lit.commands import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    os.environ.clear()
    os.environ.update(env or subprocess_env())
    os.chdir(cwd)
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            try:
                result = main(argv)  # a failure exits; fit returns its LightningCLI
                code = result if isinstance(result, int) else 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
    stderr = err.getvalue() + "".join(f"\n{w.category.__name__}: {w.message}" for w in caught)
    return subprocess.CompletedProcess(["cli.py", *argv], code, out.getvalue(), stderr)


def cli_in(cwd: Path, timeout: int = 900):
    """``cli(*args)``: ``python cli.py ARGS`` in a subprocess run in ``cwd``, asserting it succeeded; its stdout."""
    import subprocess

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=cwd, capture_output=True, text=True,
                             env=subprocess_env(), timeout=timeout)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    return cli


def assert_same_weights_and_ema(expected_checkpoint: Path, resumed_checkpoint: Path) -> dict:
    """Two checkpoints hold bitwise the same weights and the same EMA weights (an exact resume of an EMA run);
    returns the expected one, loaded."""
    import torch

    from lit.init_from import load_weights_only

    expected, resumed = load_weights_only(expected_checkpoint), load_weights_only(resumed_checkpoint)
    for key in ("state_dict", "ema_state_dict"):
        assert expected[key].keys() == resumed[key].keys()
        for name, tensor in expected[key].items():
            assert torch.equal(resumed[key][name], tensor), (key, name)
    return expected


def fake_sweep_inputs(monkeypatch) -> None:
    """For sweeps whose training a test fakes: no variant is built before the runs, and the sweep's identity is
    fixed (the code's commit is part of it, and others commit while a test runs, which is not under test)."""
    from lit.sweep import command

    monkeypatch.setattr(command, "_check_variants", lambda a, manifest, todo, log_dir: {c.variant: True for c in todo})
    monkeypatch.setattr(command, "identity", lambda recipe, variants: {"recipe_sha256": "r", "variant_files": {},
                                                                        "commit": "c", "dirty": False})


def assert_refused_in_one_line(workdir: Path, capsys, argv: list[str], expected: str) -> None:
    """``cli.py ARGV`` (in this process) ends with exit code 2, one ``error:`` line holding ``expected``, and no
    tracking store created: refused before anything was touched."""
    from lit.commands import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], errors
    assert not (workdir / "mlflow.db").exists()


def write_distribution(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]],
                       modules: dict[str, str] | None = None) -> Path:
    """Write what ``pip install`` leaves behind: a .dist-info with entry_points.txt, plus module files."""
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, eps in entry_points.items():
        lines += [f"[{group}]", *(f"{n} = {target}" for n, target in eps.items()), ""]
    (dist_info / "entry_points.txt").write_text("\n".join(lines))
    for module, source in (modules or {}).items():
        (site / f"{module}.py").write_text(source)
    return dist_info


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """A site-packages folder on sys.path; returns a function that installs a fake distribution in it."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = set(sys.modules)

    def install(name, version, entry_points, modules=None):
        path = write_distribution(site, name, version, entry_points, modules)
        importlib.invalidate_caches()
        return path

    yield install
    for module in set(sys.modules) - before:
        if getattr(sys.modules[module], "__file__", "") and str(site) in (sys.modules[module].__file__ or ""):
            del sys.modules[module]
    importlib.invalidate_caches()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in an empty folder (mlflow.db, runs/ land here) with no tracking URI from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(sys, "argv", ["cli.py"])
    return tmp_path


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An initialised MLflow sqlite store with no runs. Creating one runs MLflow's schema migrations (seconds);
    a test that only needs somewhere to log copies this file into its folder instead."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("empty_store")
    store = SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", str(folder / "artifacts"))
    store.engine.dispose()
    return folder / "mlflow.db"


@pytest.fixture
def workdir_with_store(workdir, empty_store):
    """``workdir`` with an empty default store (./mlflow.db) already in it."""
    shutil.copyfile(empty_store, workdir / "mlflow.db")
    return workdir


# Overrides that make any LM recipe tiny and fast (a handful of steps on CPU).
TINY_LM = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2",
           "--data.block_size=32", "--data.batch_size=4", "--trainer.enable_progress_bar=false",
           "--trainer.enable_model_summary=false"]


def make_image_folder(root: Path, classes=("n01440764", "n01443537"), per_class: int = 3, seed: int = 0) -> Path:
    """A tiny ImageNet-layout folder of real JPEG files (varied sizes, RGB), as the real loader sees them."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in classes:
            folder = root / split / c
            folder.mkdir(parents=True)
            for i in range(per_class):
                h, w = rng.integers(40, 80, size=2)
                pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{c}_{i}.JPEG", format="JPEG")
    return root


@pytest.fixture
def image_folder(tmp_path) -> Path:
    return make_image_folder(tmp_path / "imagenet")


# Overrides that make any ViT recipe tiny and fast.
TINY_VIT = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def plain_and_twin(make_stack, causal: bool, **kw) -> tuple:
    """A plain-residual stack with non-trivial norm gains, and a stack with the residual ``kw`` asks for carrying
    the same weights: every weight of the plain one has its twin, only the residual's own (``merge``) are new.
    ``make_stack(causal, seed=0, **arch)`` builds a stack of the calling test file's size."""
    import torch

    ref = make_stack(causal, **{k: v for k, v in kw.items() if k not in ("residual", "residual_options")})
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.2)
    other = make_stack(causal, seed=1, **kw)
    result = other.load_state_dict(ref.state_dict(), strict=False)
    assert not result.unexpected_keys  # every weight of the reference has its twin
    assert all("merge" in k for k in result.missing_keys)  # only the residual's own parameters are left out
    return ref, other
