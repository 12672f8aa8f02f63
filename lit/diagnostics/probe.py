"""A probe forward pass: the residual stream's scale by depth, each branch's scale, attention entropy and
maximum logit per layer, activation outliers by depth (``outliers.py``), each sublayer's contribution to the
stream (``contribution.py``), and the output logits, on one fixed batch.

How it stays out of the way of training:

- It is a separate forward of the task module on a fixed probe batch, under ``torch.no_grad`` and in eval
  mode (no dropout, no drop-path: two probes of the same weights give the same numbers), inside the
  trainer's precision context (the autocast training uses).
- It runs eagerly: ``torch.compiler.set_stance("force_eager")`` makes compiled blocks call their original
  Python code, so the probe's capture points run and no graph is traced or recompiled for it. Activation
  checkpointing does nothing without gradients. FSDP2 gathers each block's weights as in training, so every
  rank must run the probe together.
- Nothing is attached in between probes. For the probe's duration only: one forward hook on the first block
  reads the ``ResidualHistory`` (the stack records it for the probe's forward), one on the stack
  reads its output (the ``final`` site), and each ``Attention.inspect`` is set to compute the statistics from
  the very q, k and scale the attention uses (plugins' RoPE, q/k norm and softmax scale applied; SDPA never
  materialises probabilities, so an explicit softmax is computed here, in query chunks).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from arch_plugins.declarations import norm_output
from lit.diagnostics.contribution import contribution_metrics
from lit.diagnostics.outliers import outlier_metrics
from lit.models.transformer import Attention, TransformerStack
from lit.tracking.names import BRANCHES, EMBEDDING, FINAL, layer_name, stream_rms, sublayer_name

# Attention logits materialised at once by the explicit softmax (fp32 elements): bounds the probe's memory
# whatever the sequence length (256 MiB).
CHUNK_ELEMENTS = 1 << 26


def find_stack(model: nn.Module) -> TransformerStack | None:
    return next((m for m in model.modules() if isinstance(m, TransformerStack)), None)


def rms(x: torch.Tensor) -> torch.Tensor:
    """sqrt(mean(x^2)) over every element, in fp32."""
    return x.detach().float().square().mean().sqrt()


@torch.no_grad()
def attention_statistics(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> tuple[torch.Tensor, ...]:
    """(entropy, max logit) of softmax(scale q k^T): the entropy in nats per query, averaged over batch, heads
    and queries; the largest logit over every allowed (query, key) pair. q, k: (B, H, T, head_dim)."""
    q, k = q.float(), k.float()
    B, H, T, _ = q.shape
    S = k.shape[-2]
    chunk = max(1, CHUNK_ELEMENTS // (B * H * S))
    entropy = torch.zeros((), device=q.device)
    max_logit = torch.full((), -math.inf, device=q.device)
    keys = k.transpose(-1, -2)
    for start in range(0, T, chunk):
        logits = (q[:, :, start:start + chunk] @ keys) * scale  # (B, H, c, S)
        if causal:  # query start + r sees keys 0 .. start + r (SDPA's is_causal with T == S)
            future = torch.ones(logits.shape[-2], S, dtype=torch.bool, device=q.device).triu(start + 1)
            logits = logits.masked_fill(future, -math.inf)
        max_logit = torch.maximum(max_logit, logits.amax())
        entropy = entropy + torch.special.entr(torch.softmax(logits, dim=-1)).sum(-1).sum()
    return entropy / (B * H * T), max_logit


def reshard(module: nn.Module) -> None:
    """Give FSDP2 back the sharded parameters the probe's forward gathered. FSDP2 keeps the root module's
    parameters gathered after a forward (the backward would need them at once), but the probe has no backward:
    left so, the root's parameters would stay plain full tensors until the next training forward, and a
    checkpoint or an optimizer step in between would see them unsharded."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _eager():
    set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


@torch.no_grad()
def probe(module: nn.Module, inputs: torch.Tensor, *, stream: bool, attention: bool, outliers: bool = False,
          contribution: bool = False, precision_context=contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """Run ``module(inputs)`` once as described above; returns ``{metric name: 0-d tensor}`` (not yet synced).

    Names: ``diag/stream_rms/{embedding,layerNN.attn,layerNN.mlp,final}``, ``diag/branch_rms/layerNN.{attn,mlp}``
    (stream), ``diag/attn_entropy/layerNN``, ``diag/attn_max_logit/layerNN`` (attention),
    ``diag/kurtosis/<state>``, ``diag/max_median/<state>`` and ``diag/kurtosis/model`` (outliers; the states
    named as ``stream_rms``'s), ``diag/branch_ratio/layerNN.{attn,mlp}``, ``diag/branch_cosine/...`` and
    ``diag/io_cosine/...`` (contribution), and always ``diag/logits_rms``, ``diag/logits_max``.
    """
    stack = find_stack(module)
    captured: dict[str, object] = {}
    handles = []
    attentions: list[tuple[int, Attention]] = []
    stats: dict[str, torch.Tensor] = {}
    reads_history = stack is not None and (stream or outliers or contribution) and len(stack.blocks) > 0
    if reads_history:
        def read_history(block, args, kwargs, output):
            captured["history"] = args[1] if len(args) > 1 else kwargs["history"]

        def read_final(module, args, output):
            captured["final"] = output

        handles.append(stack.blocks[0].register_forward_hook(read_history, with_kwargs=True))
        # The final norm's output (a site that projects after its norm declares where that is), else the stack's.
        final_site = getattr(stack, "final", None)
        at = norm_output(final_site) if isinstance(final_site, nn.Module) else stack
        handles.append(at.register_forward_hook(read_final))
    if stack is not None and attention:
        attentions = [(i, block.attn) for i, block in enumerate(stack.blocks) if isinstance(block.attn, Attention)]
        for i, attn in attentions:
            def inspect(q, k, scale, causal, name=layer_name(i)):
                stats[f"diag/attn_entropy/{name}"], stats[f"diag/attn_max_logit/{name}"] = \
                    attention_statistics(q, k, scale, causal)
            attn.inspect = inspect
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        # The stack records its residual history only where something reads it: the probe does, through the hook.
        recording = stack.recording_history() if reads_history else contextlib.nullcontext()
        with _eager(), precision_context(), recording:
            logits = module(inputs)
    finally:
        for handle in handles:
            handle.remove()
        for _, attn in attentions:
            attn.inspect = None
        for m, training in modes.items():
            m.training = training
        reshard(module)
    metrics = dict(stats)
    if "history" in captured:
        history, n_layers = captured["history"], len(stack.blocks)
        # The residual stream after each sublayer, in the order it passes them.
        states = {EMBEDDING: history.states[0]}
        for i in range(n_layers):
            for j, branch in enumerate(BRANCHES):
                states[sublayer_name(i, branch)] = history.states[1 + 2 * i + j]
        states[FINAL] = captured["final"]
        if stream:
            metrics.update({stream_rms(name): rms(x) for name, x in states.items()})
            for i in range(n_layers):
                for j, branch in enumerate(BRANCHES):
                    metrics[f"diag/branch_rms/{sublayer_name(i, branch)}"] = rms(history.branches[2 * i + j])
        if outliers:
            metrics.update(outlier_metrics(states, n_layers))
        if contribution:
            metrics.update(contribution_metrics(history, n_layers))
    metrics["diag/logits_rms"] = rms(logits)
    metrics["diag/logits_max"] = logits.detach().float().max()
    return metrics
