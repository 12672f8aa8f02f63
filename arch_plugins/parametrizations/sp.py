"""Standard parametrization: what the config says, at every width and depth (today's behaviour, the default)."""

from __future__ import annotations

from arch_plugins.interfaces import Parametrization


class StandardParametrization(Parametrization):
    """Standard parametrization: the config's init, one lr, weight decay and epsilon (the default).

    Init std ``init_std`` (with GPT-2's 1/sqrt(2 n_layers) on the matrices
    that write to the stream when ``depth_scaled_init``), attention 1/sqrt(head_dim), no output or branch
    multiplier, one learning rate, weight decay and Adam epsilon for every parameter. Under Adam the best
    learning rate of this parametrization falls as the model widens (docs/scale/lr_transfer.md measures it).
    """
