"""``python -m benchmarks.gpu_check``: see benchmarks/gpu_check/__init__.py."""

import time

START = time.monotonic()  # the budget counts from here: imports are part of the 8 minutes

import os  # noqa: E402
import sys  # noqa: E402

if "--dry" in sys.argv[1:]:
    # The dry run times the Triton kernels in Triton's interpreter, which must be on before triton is first
    # imported (lightning imports it): so before anything else is.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.gpu_check.run import main  # noqa: E402

sys.exit(main(start=START))
