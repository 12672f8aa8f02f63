"""``--launch slurm``: job arrays that run a sweep's children on a cluster, through its scheduler.

One array task per child run, each ``python -m lit.sweep.child MANIFEST PHASE $SLURM_ARRAY_TASK_ID``,
all logging into the sweep's tracking store (use a tracking server, or sqlite on a shared filesystem).
With tuning there are two arrays: the seed array starts after the whole tuning array succeeded
(``--dependency=afterok``), and each seed task reads its variant's tuned value from the store. With
``--shared_value`` a third array, the runs at the baseline's tuned value, starts after the seed array succeeded:
a variant that picked the baseline's value reuses its seed run, which must be done by then.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from lit.sweep.child import children_of


def array_script(manifest_path: Path, phase: str, count: int, out: Path, sbatch: list[str], job: str) -> str:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", f"#SBATCH --array=0-{count - 1}",
             f"#SBATCH --output={out / 'logs'}/%x-%A_%a.out", *(f"#SBATCH {opt}" for opt in sbatch), "",
             "# One child run of an arch-lab sweep per array task; a task whose run already finished does nothing.",
             "set -euo pipefail", f"cd {shlex.quote(str(Path.cwd()))}",
             f"exec {shlex.quote(sys.executable)} -m lit.sweep.child {shlex.quote(str(manifest_path))} {phase} "
             '"${SLURM_ARRAY_TASK_ID:?run through sbatch, or set SLURM_ARRAY_TASK_ID}"', ""]
    return "\n".join(lines)


def write_scripts(manifest: dict, manifest_path: Path, out: Path, sbatch: list[str], gpus_per_run: int = 0) -> Path:
    """Write ``tune.sbatch`` (if tuning), ``seeds.sbatch``, ``shared.sbatch`` (with ``--shared_value``) and
    ``submit.sh``; returns submit.sh's path. With ``gpus_per_run`` each task asks for that many GPUs, unless an
    ``--sbatch`` option already asks for GPUs (its runs are told their count through the manifest's placement)."""
    if gpus_per_run and not any("gpu" in option or "gres" in option for option in sbatch):
        sbatch = [*sbatch, f"--gpus-per-task={gpus_per_run}"]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    name = f"sweep-{manifest['protocol']['sweep_id'][:8]}"
    submit = ["#!/bin/bash", "# Submit the sweep's job arrays (the seeds wait for the tuning runs).",
              "set -euo pipefail"]
    tune = children_of(manifest, "tune")
    seeds = children_of(manifest, "seed")
    dependency = ""
    if tune:
        (out / "tune.sbatch").write_text(array_script(manifest_path, "tune", len(tune), out, sbatch, f"{name}-tune"))
        submit.append(f"tune=$(sbatch --parsable {shlex.quote(str(out / 'tune.sbatch'))})")
        dependency = '--dependency=afterok:"${tune%%;*}" '
    (out / "seeds.sbatch").write_text(array_script(manifest_path, "seed", len(seeds), out, sbatch, f"{name}-seeds"))
    shared = children_of(manifest, "shared")
    if not shared:
        submit.append(f"sbatch {dependency}{shlex.quote(str(out / 'seeds.sbatch'))}")
    else:
        (out / "shared.sbatch").write_text(array_script(manifest_path, "shared", len(shared), out, sbatch,
                                                        f"{name}-shared"))
        submit.append("# The runs at the baseline's tuned value wait for the seeds (a variant may reuse its own).")
        submit.append(f"seeds=$(sbatch --parsable {dependency}{shlex.quote(str(out / 'seeds.sbatch'))})")
        submit.append(f'sbatch --dependency=afterok:"${{seeds%%;*}}" {shlex.quote(str(out / "shared.sbatch"))}')
    path = out / "submit.sh"
    path.write_text("\n".join(submit) + "\n")
    return path
