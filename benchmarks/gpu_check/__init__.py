"""The GPU check: ``python -m benchmarks.gpu_check``, one command, at most 8 minutes on one H100.

It answers, on the GPU at hand and in one process, how much of a run here is its math: the device's measured peaks
(stage A), the real ``fit`` path's syncs, launches, startup and step against a raw loop and a CUDA graph (B), a
throughput ladder at 124M, 350M and ~1.3B against a plain nanoGPT-style model compiled whole, with MFU (C), every
registered plugin's step-time ratio to the baseline, eager and compiled per block, against issue 43's targets, with
its interval, FLOP ratio, memory and whether the host is the bottleneck (D), and the Triton kernels against eager
and compiled torch in GB/s (E). The stages run A, D, E, C, B: D is what a lent GPU's run must answer. The reviews
that specified it are ``../shared/specs/gpu-readiness.md`` (section 9) and ``../shared/specs/gpu-plugins.md``
(section 4, stage D); the page it writes is ``docs/performance/gpu.md``.

    python -m benchmarks.gpu_check                  # one GPU; --budget_s 460 by default, imports included
    python -m benchmarks.gpu_check --stages AC      # some stages only
    python -m benchmarks.gpu_check --dry            # anywhere: every stage on CPU at tiny shapes (the tests run it)

One file per stage (calibration, real_path, ladder, plugins, triton_kernels), the timing guards in ``measure``,
the clock and stage D's plan in ``budget``, a paired ratio's interval and verdict in ``ratios``, the ops a missed
target costs in ``costliest_ops``, the Markdown in ``report``, the command in ``run``.
"""
