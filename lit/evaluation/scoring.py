"""What an evaluation asks of a language model, over token ids: the log-likelihood of a continuation after a
context, the rolling log-likelihood of a whole document, and a greedy continuation. No lm-eval here, so these
rules are tested without the harness installed.

Every sequence is left-truncated to the model's context (``block_size``): a continuation is scored after as many of
the tokens before it as fit, which is what lm-eval's own Hugging Face model does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lit.errors import UserInputError

Pair = tuple[Sequence[int], Sequence[int]]


class SequenceScorer:
    """Scores token sequences with ``model`` (ids (B, T) -> logits (B, T, V)) of context ``block_size``, at most
    ``batch_size`` sequences per forward."""

    def __init__(self, model: nn.Module, block_size: int, batch_size: int = 16, device: str | torch.device = "cpu"):
        if batch_size < 1:
            raise UserInputError(f"--batch-size must be >= 1, got {batch_size}")
        self.model, self.block_size, self.batch_size = model.eval(), int(block_size), batch_size
        self.device = torch.device(device)

    @torch.no_grad()
    def loglikelihood(self, pairs: Sequence[Pair]) -> list[tuple[float, bool]]:
        """For each (context, continuation): the summed log-probability of the continuation's tokens, and whether
        each of them is the argmax (greedy) prediction. The context must hold at least one token. A continuation
        longer than the model's context is scored in consecutive windows of ``block_size`` predictions, each
        token after as many of the tokens before it as the window leaves room for (lm-eval's rolling windows)."""
        windows = []
        for i, (context, continuation) in enumerate(pairs):
            if not context:
                raise ValueError("a continuation is scored after at least one token (a document-start token)")
            if not continuation:
                raise ValueError("an empty continuation has no log-likelihood")
            before, continuation = list(context), list(continuation)
            for k in range(0, len(continuation), self.block_size):
                chunk = continuation[k:k + self.block_size]
                window = ((before + continuation[:k])[-self.block_size:] + chunk)[-(self.block_size + 1):]
                windows.append((i, window[:-1], window[1:], len(chunk)))
        totals, greedy = [0.0] * len(pairs), [True] * len(pairs)
        # Longest first, so a batch pads little; right padding never reaches an earlier position (causal model).
        windows.sort(key=lambda w: -len(w[1]))
        for start in range(0, len(windows), self.batch_size):
            batch = windows[start:start + self.batch_size]
            width = len(batch[0][1])
            inputs = torch.zeros(len(batch), width, dtype=torch.long)
            for row, (_, ids, _, _) in enumerate(batch):
                inputs[row, :len(ids)] = torch.tensor(ids)
            log_probs = F.log_softmax(self.model(inputs.to(self.device)).float(), dim=-1).cpu()
            for row, (index, ids, targets, n) in enumerate(batch):
                scored = log_probs[row, len(ids) - n:len(ids)]
                wanted = torch.tensor(targets[-n:])
                totals[index] += scored.gather(1, wanted[:, None]).sum().item()
                greedy[index] = greedy[index] and bool((scored.argmax(-1) == wanted).all())
        return list(zip(totals, greedy, strict=True))

    def loglikelihood_rolling(self, documents: Sequence[Sequence[int]], prefix_id: int) -> list[float]:
        """The summed log-probability of each whole document after the document-start token (perplexity tasks):
        every token scored once, in windows of ``block_size`` predictions, all batched together."""
        scored = [d for d, tokens in enumerate(documents) if tokens]
        totals = [0.0] * len(documents)
        pairs = [([prefix_id], documents[d]) for d in scored]
        for d, (logprob, _) in zip(scored, self.loglikelihood(pairs), strict=True):
            totals[d] = logprob
        return totals

    @torch.no_grad()
    def greedy(self, context: Sequence[int], max_new_tokens: int, done: Callable[[list[int]], bool] = lambda ids: False,
               chunk: int = 16) -> list[int]:
        """Greedy continuation of ``context`` with the model's own ``generate`` (temperature 0), at most
        ``max_new_tokens``, stopping after the chunk in which ``done(new_ids)`` turns true."""
        idx = torch.tensor([list(context)[-self.block_size:]], dtype=torch.long, device=self.device)
        new: list[int] = []
        while len(new) < max_new_tokens and not done(new):
            step = min(chunk, max_new_tokens - len(new))
            out = self.model.generate(idx, step, temperature=0)
            new += out[0, idx.size(1):].tolist()
            idx = out[:, -self.block_size:]
        return new
