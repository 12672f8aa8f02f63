"""The versions pyproject.toml declares are true: every dependency has a lower bound, and the lowest declared
versions install together in a fresh venv and pass a smoke subset (slow: it installs torch into the venv)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from packaging.version import Version

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

# What the smoke subset touches: training and a checkpoint (torch, Lightning, jsonargparse, MLflow), the statistics
# (numpy, scipy, pandas), timm's RandAugment on real images (timm, Pillow, torchvision), a tokenizer, the digits.
SMOKE = ["tests/test_checkpoint_writing.py::test_a_write_that_fails_partway_leaves_the_previous_checkpoint_whole",
         "tests/test_resume.py::test_a_nan_loss_stops_the_run_with_one_line_and_keeps_the_last_good_checkpoint",
         "tests/test_sequential.py", "tests/test_compare_examples.py", "tests/test_image_augment_draws.py",
         "tests/test_image_data.py"]
# Packages the code does not import itself and that need no floor of ours: torch's own compiler.
NO_FLOOR_NEEDED = {"triton"}


def requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])


def lowest_pins(reqs: list[str]) -> dict[str, str]:
    """name -> ``name==lowest`` (markers kept) for every requirement with a ``>=`` or ``==`` bound."""
    pins = {}
    for req in reqs:
        spec, _, marker = req.partition(";")
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower()
        bound = re.search(r"(>=|==)\s*([0-9][^,\s]*)", spec)
        if bound:
            pins[name] = f"{name}=={bound.group(2)}" + (f"; {marker.strip()}" if marker else "")
    return pins


def test_every_dependency_has_a_lower_bound():
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements()}
    unbounded = names - set(lowest_pins(requirements())) - NO_FLOOR_NEEDED
    assert unbounded == set(), f"no lower bound for {sorted(unbounded)}"


def test_pillow_keeps_the_upper_bound_that_timm_needs():
    # Pillow 13 rejects the 0-bit posterize that timm's RandAugment asks for at its top magnitudes.
    (pillow,) = [r for r in requirements() if r.lower().startswith("pillow")]
    assert "<13" in pillow.replace(" ", "")


@pytest.mark.slow
def test_the_lowest_declared_versions_install_and_pass_a_smoke_subset(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    constraints = tmp_path / "lowest.txt"
    constraints.write_text("\n".join(lowest_pins(requirements()).values()) + "\n")
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(constraints), "-e",
                              f"{REPO}[dev]"], capture_output=True, text=True, timeout=3600)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    installed = {n.lower().replace("_", "-"): v for n, _, v in (line.partition("==") for line in frozen.split())}
    for name, pin in lowest_pins(requirements()).items():
        if name in installed:  # a marker may leave one out (nvidia-ml-py off Linux)
            wanted = pin.split(";")[0].split("==")[1]
            assert Version(installed[name].split("+")[0]) == Version(wanted), f"{pin}: got {installed[name]}"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH")}
    smoke = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE], cwd=REPO,
                           capture_output=True, text=True, timeout=1800, env={**env, "OMP_NUM_THREADS": "1"})
    assert smoke.returncode == 0, smoke.stdout[-4000:] + smoke.stderr[-2000:]
