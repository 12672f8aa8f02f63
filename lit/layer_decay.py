"""Layer-wise learning-rate decay for fine-tuning a ViT (BEiT, MAE, timm's ``param_groups_layer_decay``).

Layers near the input hold the most general features of a pretrained model, so they move least: with ``L`` blocks,
the patch embedding, class token and positions are layer 0, block ``i`` is layer ``i + 1``, the final norm belongs
to the last block (layer ``L``) and the head, with anything else after the blocks, is layer ``L + 1``; a parameter
of layer ``l`` trains at ``decay ** (L + 1 - l)`` times the learning rate. That is timm's rule for its ViTs
(``param_groups_layer_decay`` with the ViT's ``group_matcher``; MAE's ``get_layer_id_for_vit`` differs only in
leaving the final norm at the full rate). The factor is declared on each parameter as an
optimizer scale (``arch_plugins.declarations.declare_optimizer_scale``), the mechanism parametrizations already use,
so every optimizer that honours declared scales applies it, and it composes by multiplication with a
parametrization's own factors. Layers are found from the ViT's structure (its embedding modules and its
``stack.blocks``), never by parsing parameter names. Parameters of the stack outside the blocks (a norm or residual
state shared by all blocks) count as the last layer: they keep the full rate.
"""

from __future__ import annotations

from torch import nn

from arch_plugins.declarations import declare_optimizer_scale


def layer_ids(vit: nn.Module) -> dict[int, int]:
    """The layer (0 .. L + 1) of every parameter of ``vit`` (``lit.models.vit.ViT``), by ``id``."""
    blocks = vit.stack.blocks
    last = len(blocks) + 1
    ids = {id(p): last for p in vit.parameters()}
    for p in vit.patch.parameters():
        ids[id(p)] = 0
    for p in (vit.cls_token, vit.pos_embed):
        if isinstance(p, nn.Parameter):
            ids[id(p)] = 0
    for i, block in enumerate(blocks):
        for p in block.parameters():
            ids[id(p)] = i + 1
    for p in vit.stack.final.parameters():
        ids[id(p)] = len(blocks)
    return ids


def declare_layer_decay(vit: nn.Module, decay: float) -> dict[int, float]:
    """Declare ``decay ** (L + 1 - layer)`` as the lr multiplier of each parameter of ``vit``; the multipliers by id.

    Call once per model (declarations compose by multiplication)."""
    if not 0 < decay <= 1:
        raise ValueError(f"layer decay must be in (0, 1] (1: off), got {decay!r}")
    ids = layer_ids(vit)
    last = len(vit.stack.blocks) + 1
    scales = {pid: decay ** (last - layer) for pid, layer in ids.items()}
    for module in vit.modules():
        for name, p in module.named_parameters(recurse=False):
            if scales[id(p)] != 1.0:
                declare_optimizer_scale(module, name, lr=scales[id(p)])
    return scales
