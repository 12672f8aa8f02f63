"""How blocks execute (lit/parallel.py): activation checkpointing and torch.compile change nothing but cost.

The residuals that read the history of earlier layers (LAUREL-PA) are the hard case for activation
checkpointing: a recomputation must see the history as it was when the block first ran.
"""

from __future__ import annotations

import pytest
import torch

from lit.language_model import LanguageModel
from lit.models import TransformerConfig
from lit.parallel import checkpoint_blocks, compile_model

# A history-reading residual, nGPT's unit-norm plumbing, Pattention; dropout checks random-state replay.
ARCHS = {
    "laurel_rw_lr_pa": dict(residual="laurel_rw_lr_pa"),
    "laurel_pa_sublayer": dict(residual="laurel_pa", residual_options={"placement": "sublayer"}),
    "ngpt": dict(norm="hypersphere", residual="ngpt"),
    "pattention": dict(norm="layernorm_nonparam", projection="pattention"),
    # Attention Residuals read the history too (every block's sum); hyper-connections carry a wider stream.
    "attnres_block": dict(residual="attnres_block", residual_options={"block_size": 2}),
    "hyperconn": dict(residual="hyperconn"),
    "mhc": dict(residual="mhc"),  # per-token coefficients: branch_input and the merge recompute them alike
}


def model(arch: dict, dropout: float = 0.0) -> LanguageModel:
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=32, n_layers=3, n_heads=2, dropout=dropout, **arch)
    m = LanguageModel(vocab_size=17, block_size=16, arch=cfg)
    with torch.no_grad():  # move every parameter off its init (LAUREL's B starts at zero, and so do legacy PA's gammas)
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def loss_and_grads(m: LanguageModel, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    idx = torch.randint(0, 17, (2, 16))
    loss = m._loss(m(idx), idx)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("name", ARCHS)
def test_activation_checkpointing_gives_the_same_loss_and_gradients(name):
    dropout = 0.1 if name == "laurel_rw_lr_pa" else 0.0
    reference = model(ARCHS[name], dropout)
    expected_loss, expected_grads = loss_and_grads(reference)
    checkpointed = model(ARCHS[name], dropout)
    checkpoint_blocks(checkpointed.model)
    checkpoint_blocks(checkpointed.model)  # idempotent
    loss, grads = loss_and_grads(checkpointed)
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected_grads.keys()
    for n, g in grads.items():
        torch.testing.assert_close(g, expected_grads[n], rtol=0, atol=1e-7, msg=n)
    assert [n for n, _ in checkpointed.named_parameters()] == [n for n, _ in reference.named_parameters()]


def test_activation_checkpointing_recomputes_each_block_in_backward():
    m = model(ARCHS["laurel_rw_lr_pa"])
    calls = []
    for block in m.model.stack.blocks:
        block.attn.register_forward_hook(lambda *_: calls.append(1))
    loss_and_grads(m)
    assert len(calls) == 3  # once per block
    checkpoint_blocks(m.model)
    calls.clear()
    loss_and_grads(m)
    assert len(calls) == 6  # again in backward
    calls.clear()
    with torch.no_grad():
        m(torch.zeros(1, 4, dtype=torch.long))
    assert len(calls) == 3  # nothing to recompute without gradients


@pytest.mark.parametrize("per_block", [False, True], ids=["whole", "per_block"])
def test_a_compiled_model_computes_what_the_eager_model_computes(per_block):
    reference = model(ARCHS["laurel_rw_lr_pa"])
    expected_loss, expected_grads = loss_and_grads(reference)
    compiled = model(ARCHS["laurel_rw_lr_pa"])
    compile_model(compiled.model, per_block=per_block)
    parts = compiled.model.stack.blocks if per_block else [compiled.model]
    assert all(part._compiled_call_impl is not None for part in parts)
    loss, grads = loss_and_grads(compiled)
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-5)
    for n, g in grads.items():
        torch.testing.assert_close(g, expected_grads[n], rtol=1e-4, atol=1e-5, msg=n)
    assert compiled.state_dict().keys() == reference.state_dict().keys()  # checkpoints move between the two


def test_fsdp2_input_casting_hands_every_block_the_same_residual_history():
    # FSDP2 with a bf16 policy rebuilds each block's arguments to cast them (dataclasses and lists are copied);
    # a history copied per block loses every entry the block appends, and LAUREL-PA would look back at a
    # history missing the blocks before it.
    from torch.distributed.utils import _apply_to_tensors

    from arch_plugins.interfaces import ResidualHistory

    history = ResidualHistory(states=[torch.zeros(2)])
    h, passed, rope = _apply_to_tensors(lambda t: t.to(torch.bfloat16), (torch.zeros(2), history, None))
    assert passed is history and passed.states is history.states
    assert h.dtype == torch.bfloat16  # the tensors are still cast
