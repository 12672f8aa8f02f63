"""One Inductor cache per sweep: the first child of a variant pays its compile, the others load it.

A sweep runs the same model many times (seeds, tuning values): its compiled graphs are the same each time, so a
child that finds them on disk skips Inductor's code generation and the C++/Triton builds. Two of torch's caches do
it, both keyed by the graph and the settings that change it: the FX graph cache (Inductor's output for a graph) and
the AOTAutograd cache (the forward and backward graphs with their Inductor outputs). Both are on by default in
torch, in ``/tmp/torchinductor_<user>``: a folder of one machine (a SLURM array spreads children over nodes),
shared with every other compile of the user and never cleaned. A sweep's children instead get one folder inside
the sweep's own (``sweeps/<id>/inductor_cache``, beside ``runs/`` and ``logs/``), which every node of a cluster
sees where the sweep folder is on a shared filesystem, and which goes when the sweep's folder goes.

Set by each child (``lit/sweep/child.py``) before its fit, in its environment (so the ranks a child starts on
several devices, and Inductor's compile workers, inherit it) and in torch's config (read from the environment when
torch imported it, which a worker forked from the sweep did long before). A folder given in the environment
(``TORCHINDUCTOR_CACHE_DIR``) wins. Measured on CPU: docs/performance/compile-cache.md.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
FOLDER = "inductor_cache"


def environment(sweep_folder: str | Path) -> dict[str, str]:
    """The variables a child of the sweep in ``sweep_folder`` compiles under."""
    return {CACHE_DIR_ENV: os.environ.get(CACHE_DIR_ENV) or str(Path(sweep_folder) / FOLDER),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",  # the FX graph cache, forced on
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}  # the AOTAutograd cache, forced on


def use(sweep_folder: str | Path) -> dict[str, str]:
    """Compile under the sweep's cache from now on in this process and those it starts; returns the variables."""
    env = environment(sweep_folder)
    os.environ.update(env)
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    aot_config.enable_autograd_cache = True
    return env
