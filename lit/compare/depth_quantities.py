"""The per-sublayer diagnostics beyond the stream RMS, by depth: activation outliers (excess kurtosis, max/median
|activation|) and each sublayer's contribution (branch/stream norm ratio and cosine, the stream's cosine across the
sublayer), per variant at the last step the runs logged them, mean over seeds. Pure functions of a ``Sweep``."""

from __future__ import annotations

import pandas as pd

from lit.compare.analysis import depth_profile
from lit.compare.runs import Sweep
from lit.tracking.names import DEPTH_QUANTITY_PREFIXES

# prefix -> the axis label of its panel
LABELS = {
    "diag/kurtosis/": "excess kurtosis (OSP)",
    "diag/max_median/": "max / median |activation|",
    "diag/branch_ratio/": "‖branch‖ / ‖stream‖",
    "diag/branch_cosine/": "cos(branch, stream)",
    "diag/io_cosine/": "cos(stream before, after)",
}


def measured_runs(sweep: Sweep) -> pd.DataFrame:
    """The counted runs that logged the compared metric (those the report's numbers come from)."""
    with_metric = set(sweep.history.loc[sweep.history["key"] == sweep.metric, "run_id"])
    return sweep.runs[sweep.runs["run_id"].isin(with_metric)]


def depth_quantities(sweep: Sweep) -> dict[str, dict[str, pd.Series]]:
    """prefix -> {variant: values indexed by sublayer in stream order} at the last logged step, for each quantity
    some run logged; empty when none did."""
    runs = measured_runs(sweep)
    profiles = {}
    for prefix in DEPTH_QUANTITY_PREFIXES:
        profile = depth_profile(sweep, runs, prefix)
        if profile is not None:
            profiles[prefix] = profile.last
    return profiles
