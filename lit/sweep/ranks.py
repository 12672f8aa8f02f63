"""A sweep child that trains on several devices: its other ranks, started as ``fit`` starts them.

Lightning starts ranks 1..n-1 of a run by running the process's command line again (``sys.argv``, with
``LOCAL_RANK`` set). In a sweep worker that command line is the sweep's own, so while a child runs, the worker's
command line is this file instead: each other rank runs the child's ``fit`` arguments (the same run id: only rank 0
logs) and, when the child is tested, the same test, so its collectives meet rank 0's. Rank 0 keeps everything a
child owns (its MLflow run, its tags and outcome); the other ranks touch none of it.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

RANK_ARGS = "ARCH_LAB_SWEEP_RANK_ARGS"  # the other ranks' work: {"args": [...fit args], "test": bool}


@contextmanager
def other_ranks_run(args: list[str], test: bool):
    """While a child runs: a rank Lightning starts runs ``args`` (and the test), not the sweep's command line."""
    import __main__

    saved = sys.argv, getattr(__main__, "__spec__", None), os.environ.get(RANK_ARGS)
    sys.argv = [str(Path(__file__).resolve())]
    __main__.__spec__ = None  # Lightning runs `python sys.argv[0]` only for a main module without a spec
    os.environ[RANK_ARGS] = json.dumps({"args": args, "test": test})
    try:
        yield
    finally:
        sys.argv, __main__.__spec__ = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop(RANK_ARGS, None)
        else:
            os.environ[RANK_ARGS] = saved[2]


def main() -> int:
    """One of ranks 1..n-1 of a sweep child: fit, then test if the child tests."""
    from lit.cli import main as cli_main

    work = json.loads(os.environ[RANK_ARGS])
    cli = cli_main(work["args"])
    if work["test"]:
        cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the project is importable
    from lit.sweep.ranks import main as rank_main

    sys.exit(rank_main())
