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
        ``max_new_tokens``, stopping after the chunk of ``chunk`` tokens in which ``done(new_ids)`` turns true."""
        idx = torch.tensor([list(context)[-self.block_size:]], dtype=torch.long, device=self.device)
        out = self.model.generate(idx, max_new_tokens, temperature=0, stop=lambda new: done(new[0].tolist()),
                                  stop_every=chunk)
        return out[0, idx.size(1):].tolist()

    @torch.no_grad()
    def greedy_batch(self, contexts: Sequence[Sequence[int]], max_new_tokens: int,
                     done: Callable[[list[int]], bool] = lambda ids: False, chunk: int = 16) -> list[list[int]]:
        """``greedy`` for many contexts, ``batch_size`` at a time in left-padded batches through one KV cache each.

        Each context is left-truncated to ``block_size - max_new_tokens`` tokens (lm-eval's rule for its Hugging
        Face models), so prompt and continuation fit the model's context and each row decodes what it would alone.
        A batch stops after the chunk in which ``done`` holds for every row. A model that cannot keep a KV cache
        (``kv_cache_conflict``), or ``max_new_tokens`` not below block_size, decodes one context at a time."""
        room = self.block_size - max_new_tokens
        if room >= 1:
            contexts = [list(c)[-room:] for c in contexts]
        conflict = getattr(self.model, "kv_cache_conflict", lambda: "no KV cache")()
        if room < 1 or conflict is not None:
            return [self.greedy(c, max_new_tokens, done, chunk) for c in contexts]
        if any(not c for c in contexts):
            raise ValueError("a continuation is generated after at least one token (a document-start token)")
        outputs: list[list[int]] = [[] for _ in contexts]
        order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))  # similar lengths pad little
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            width = len(contexts[rows[0]])
            idx = torch.zeros(len(rows), width, dtype=torch.long)
            pad = torch.tensor([width - len(contexts[i]) for i in rows])
            for row, i in enumerate(rows):
                idx[row, pad[row]:] = torch.tensor(contexts[i])
            out = self.model.generate(idx.to(self.device), max_new_tokens, temperature=0, pad=pad.to(self.device),
                                      stop=lambda new: all(done(ids) for ids in new.tolist()), stop_every=chunk)
            for row, i in enumerate(rows):
                outputs[i] = out[row, width:].tolist()
        return outputs
