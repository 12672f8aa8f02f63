"""What autocast does on a device type, asked so that a meta tensor's device is a fair question too.

``torch.is_autocast_enabled(device_type)`` raises for a device type autocast does not know, and
``torch.autocast(device_type, enabled=False)`` refuses one: "meta", where the FLOP count runs a model's forward first
(``lit.compute``; the conformance kit's ``meta`` check). Plugins that turn autocast off around their own arithmetic, or
make its casts by hand (an autograd.Function that keeps what its GEMMs read for the backward), ask here instead.
"""

from __future__ import annotations

import contextlib

import torch


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts a matmul's inputs to on ``device_type``, or None where it is off or does not exist."""
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or nothing to turn off on a device type autocast does not know
    (``torch.autocast`` refuses those, meta among them)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
