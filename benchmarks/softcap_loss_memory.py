"""What the training loss keeps for backward with a logit soft-cap, at the 124M shape (vocabulary 50,304, 8 x 1024
tokens, d_model 768, bf16 autocast), counted on fake tensors by the plugin cost audit's ``SavedBytes``.

Three rows: the whole logits through the cap module (what ``benchmarks.plugin_cost`` and the GPU check run), one
chunk of the chunked loss (``lit/readout_loss.py``, 256 MiB of fp32 logits per chunk) with the cap as its own module
(before issue 43's change), and the same chunk with the cap inside the cross-entropy's node
(``arch_plugins/stabilisers/softcapped_cross_entropy.py``). A chunk's row is what its recomputation holds in
backward, the chunked loss's peak; the head's bf16 weight copy is in every row.

    python -m benchmarks.softcap_loss_memory
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from arch_plugins.stabilisers.logit_softcap import LogitSoftCap
from arch_plugins.stabilisers.softcapped_cross_entropy import softcapped_cross_entropy_sums
from benchmarks.plugin_cost import SavedBytes
from lit.readout_loss import chunk_tokens

VOCAB, D_MODEL, TOKENS, CAP, CHUNK_MIB = 50304, 768, 8 * 1024, 30.0, 256


def cap_module_sums(head, hidden, targets):
    logits = LogitSoftCap(CAP)(head(hidden))
    cross_entropy = F.cross_entropy(logits.float(), targets, reduction="sum")
    return cross_entropy, torch.logsumexp(logits.float(), dim=-1).square().sum()


def cap_in_node_sums(head, hidden, targets):
    return softcapped_cross_entropy_sums(head(hidden), targets, CAP)


def saved_mib(fn, tokens: int) -> float:
    with FakeTensorMode():
        head = torch.nn.Linear(D_MODEL, VOCAB, bias=False)
        hidden = torch.randn(tokens, D_MODEL, requires_grad=True)
        targets = torch.randint(0, VOCAB, (tokens,))
        saved = SavedBytes({head.weight.untyped_storage()._cdata, hidden.untyped_storage()._cdata})
        with torch.autocast("cpu", dtype=torch.bfloat16), saved.hooks():
            fn(head, hidden, targets)
    return saved.nbytes / 2 ** 20


def main() -> None:
    chunk = chunk_tokens(VOCAB, CHUNK_MIB)
    print("| what | tokens | saved for backward |\n|---|---:|---:|")
    for what, fn, tokens in (("whole logits, cap module", cap_module_sums, TOKENS),
                             ("one chunk, cap module", cap_module_sums, chunk),
                             ("one chunk, cap inside the cross-entropy", cap_in_node_sums, chunk)):
        print(f"| {what} | {tokens:,} | {saved_mib(fn, tokens):,.1f} MiB |")


if __name__ == "__main__":
    main()
