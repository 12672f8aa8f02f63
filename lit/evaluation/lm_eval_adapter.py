"""An lm-evaluation-harness ``LM`` for arch-lab checkpoints (needs the ``eval`` extra: ``pip install -e '.[eval]'``).

lm-eval's ``TemplateLM`` turns text requests into token ids (a context's trailing spaces moved onto the
continuation; an empty context scored after the document-start token); ``SequenceScorer`` does the rest, batched
and left-truncated to the model's context. ``generate_until`` is greedy: requests with the same stop strings and
length share left-padded batches decoded through one KV cache each (``SequenceScorer.greedy_batch``).
"""

from __future__ import annotations

from lm_eval.api.model import TemplateLM

from lit.evaluation.scoring import SequenceScorer
from lit.evaluation.text_codec import TextCodec


class ArchLabLM(TemplateLM):
    def __init__(self, scorer: SequenceScorer, codec: TextCodec, max_gen_toks: int = 256):
        super().__init__()
        self.scorer, self.codec, self.max_gen_toks = scorer, codec, max_gen_toks

    @property
    def eot_token_id(self) -> int:
        return self.codec.prefix_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.codec.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.codec.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self.scorer.loglikelihood([(context, continuation) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        documents = [self.codec.encode(request.args[0]) for request in requests]
        return self.scorer.loglikelihood_rolling(documents, self.codec.prefix_id)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[tuple, list[tuple[int, list[int]]]] = {}
        for n, request in enumerate(requests):
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = (until,) if isinstance(until, str) else tuple(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            context_ids = self.codec.encode(context) if context else []
            groups.setdefault((until, max_new), []).append((n, [self.codec.prefix_id, *context_ids]))
        outputs = [""] * len(requests)
        for (until, max_new), members in groups.items():
            def done(ids: list[int], until=until) -> bool:
                return any(stop in self.codec.decode(ids) for stop in until)

            news = self.scorer.greedy_batch([ids for _, ids in members], max_new, done=done)
            for (n, _), new in zip(members, news, strict=True):
                text = self.codec.decode(new)
                for stop in until:
                    text = text.split(stop)[0]
                outputs[n] = text
        return outputs
