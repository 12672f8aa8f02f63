"""`python cli.py fit` imports what a text run needs and no more: torchmetrics (through Lightning) skips scipy,
torchvision and matplotlib (lit/lazy_imports.py), and scikit-learn waits for the digits. The metrics the tasks use
still work. Measured start-up: benchmarks/startup.py, docs/performance/startup.md."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO, subprocess_env

PROBE = """
import json, sys
from lit.lazy_imports import install
install()
import lit.cli
import torch
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity
import torchmetrics.utilities.imports as flags
perplexity = Perplexity()
perplexity.update(torch.zeros(1, 2, 4), torch.zeros(1, 2, dtype=torch.long))
accuracy = MulticlassAccuracy(num_classes=3, average="micro")
accuracy.update(torch.tensor([0, 1]), torch.tensor([0, 2]))
print(json.dumps({"loaded": sorted(m for m in ("scipy", "matplotlib", "sklearn", "pandas") if m in sys.modules),
                  "perplexity": float(perplexity.compute()), "accuracy": float(accuracy.compute()),
                  "torchvision_flag": bool(flags._TORCHVISION_AVAILABLE)}))
"""


def test_the_training_cli_imports_no_scipy_matplotlib_or_sklearn_and_its_metrics_work():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True,
                         env=subprocess_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == [], seen
    assert abs(seen["perplexity"] - 4.0) < 1e-5 and seen["accuracy"] == 0.5  # uniform logits over 4 tokens
    assert seen["torchvision_flag"] is False  # torchmetrics' image backbones say torchvision is not loaded
