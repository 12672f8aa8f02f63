"""Repository hygiene: outputs of training (checkpoints, run folders, local MLflow stores) are never committed."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO

# Folders that training and tracking write into (anywhere in the tree), and checkpoint files.
OUTPUT_FOLDERS = ("checkpoints", "runs", "mlruns", "mlartifacts", "lightning_logs")


def tracked_outputs(paths: list[str]) -> list[str]:
    """The paths among ``paths`` (as ``git ls-files`` prints them) that are training outputs."""
    return [p for p in paths
            if p.endswith(".ckpt") or p.endswith("/mlflow.db") or p == "mlflow.db"
            or any(part in OUTPUT_FOLDERS for part in p.split("/")[:-1])]


def test_the_rule_recognises_outputs():
    assert tracked_outputs(["checkpoints/last.ckpt", "a/runs/1/2/x.yaml", "mlruns/0/meta.yaml", "x/model.ckpt",
                            "mlflow.db", "lit/checkpoints.py", "tests/test_resume.py", "docs/runs.md"]) == [
        "checkpoints/last.ckpt", "a/runs/1/2/x.yaml", "mlruns/0/meta.yaml", "x/model.ckpt", "mlflow.db"]


def test_no_checkpoint_or_run_folder_is_tracked():
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git is not available")
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    found = tracked_outputs([p for p in listed.stdout.split("\0") if p])
    assert not found, f"training outputs are tracked by git (git rm -r --cached them): {found[:10]}"
