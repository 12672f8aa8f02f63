"""Exact bits per byte: the nats of every scored token summed, over the UTF-8 bytes those tokens decode to.

Bits per byte compares models across tokenizers and vocabularies where nats per token do not. Dividing a mean loss
by a corpus-average bytes per token is off by however much the scored text's bytes per token differ from the
average (13% on one set of shards); counting each target token's own bytes (as nanochat's ``evaluate_bpb`` does) is
exact.

Special tokens (an EOT) decode to no text. Here their nats count and their bytes are 0: predicting where a document
ends is part of modelling the text. nanochat's ``evaluate_bpb`` leaves them out instead (it masks the nats of every
target whose byte count is 0). Both are exact; this one is higher by the EOTs' nats over the bytes: 0.085% on the
validation split of one trial (1.350913 against 1.349762; 0.02% on its test split), more for shorter documents, since
there is one EOT per document. Compare bits per byte with nanochat's figures with that in mind.
"""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric


class BitsPerByte(Metric):
    """Sums over an epoch (and over processes): ``sum(nats) / sum(bytes) / ln 2``, a ratio of sums, not a mean
    of per-batch ratios."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("nats", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("bytes", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, token_nats: torch.Tensor, targets: torch.Tensor, token_bytes: torch.Tensor) -> None:
        """``token_nats``: each target's cross-entropy; ``token_bytes[id]``: the bytes token ``id`` decodes to."""
        self.nats += token_nats.detach().double().sum()
        self.bytes += token_bytes[targets].sum()

    def compute(self) -> torch.Tensor:
        return self.nats / self.bytes.clamp(min=1) / math.log(2)
