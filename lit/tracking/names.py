"""The names runs are written and read back by: run tags, experiment tags, and the diagnostics' metrics that
``compare`` reads. One definition each, so a writer and a reader cannot drift apart (a renamed metric
would otherwise leave the depth profile silently empty). The sweep's own tags live in ``lit/sweep/protocol.py``.
"""

from __future__ import annotations

import re

# --- experiment tags ---
# MLflow's UI opens an experiment in the view its kind names; without the tag it guesses, and an empty or
# young experiment opens in the GenAI view (traces, prompts, judges) rather than on runs and charts.
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
TRAINING_EXPERIMENT = {EXPERIMENT_KIND: MODEL_TRAINING}

# --- run tags ---
MEANT_FOR = "arch_lab.meant_for"  # the server a run logged to the local store instead (if_unreachable=local)
STOPPED_BY = "arch_lab.stopped_by"  # the signal that stopped training
STOPPED_AT_STEP = "arch_lab.stopped_at_step"
RESUME_FROM = "arch_lab.resume_from"  # the checkpoint a stopped training continues from
SYNCED_TO = "arch_lab.synced_to"  # on a local run: where it was copied (a second copy is refused)
COPIED_FROM = "arch_lab.copied_from"  # on the copy: the store and run it came from
GIT_COMMIT = "mlflow.source.git.commit"
GIT_DIRTY = "git.dirty"


def plugin_tag(kind: str) -> str:
    """The tag holding the name of the ``kind`` plugin a model was built with (``<tag>.package``: its package)."""
    return f"plugin.{kind}"


# --- diagnostics metrics read by compare ---
DIAGNOSTICS_PREFIX = "diag/"
STREAM_RMS_PREFIX = "diag/stream_rms/"  # + a sublayer name: the residual stream's RMS after it
# Per-sublayer quantities the compare report draws by depth beside the stream RMS (lit/compare/depth_quantities.py).
DEPTH_QUANTITY_PREFIXES = ("diag/kurtosis/", "diag/max_median/", "diag/branch_ratio/", "diag/branch_cosine/",
                           "diag/io_cosine/")
SPIKE_COUNT = "diag/spike_count"
EMBEDDING, FINAL = "embedding", "final"
BRANCHES = ("attn", "mlp")  # a block's two sublayers, in the order the stream passes them


def layer_name(index: int) -> str:
    """Block ``index`` (0-based) in metric names: ``layer00``, ``layer01``, ..."""
    return f"layer{index:02d}"


def sublayer_name(index: int, branch: str) -> str:
    """A block's sublayer in metric names: ``layer03.attn``."""
    return f"{layer_name(index)}.{branch}"


def stream_rms(sublayer: str) -> str:
    """The metric of the stream's RMS after ``sublayer`` (``embedding``, ``layerNN.attn``, ..., ``final``)."""
    return STREAM_RMS_PREFIX + sublayer


# A sublayer name as the functions above build it; ``block`` and ``part`` say where it sits in the stream.
SUBLAYER = re.compile(rf"^(?:{EMBEDDING}|layer(?P<block>\d{{2}})\.(?P<part>{'|'.join(BRANCHES)})|{FINAL})$")
