"""Score a small multiple-choice set at every validation, so the curves show downstream accuracy beside the loss.

    fit ... --trainer.callbacks+=lit.evaluation.multiple_choice_callback.MultipleChoiceScore \\
            --trainer.callbacks.init_args.items=tasks/shakespeare_cloze.jsonl

Each item is ``{"context", "choices", "label"}`` (the JSONL ``cloze_task.write_cloze_task`` writes, lm-eval's
multiple-choice fields); the answer is the choice of highest log-likelihood after the context, as lm-eval's
``acc``. Logged as ``val/mc_acc``. Without ``items``: 40 items of the tinyshakespeare cloze task.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from lit.errors import UserInputError


class MultipleChoiceScore(L.Callback):
    def __init__(self, items: str | None = None, batch_size: int = 32, metric: str = "val/mc_acc"):
        from lit.evaluation.cloze_task import cloze_items

        if items is None:
            self.items = cloze_items(40)
        else:
            path = Path(items)
            if not path.is_file():
                raise UserInputError(f"MultipleChoiceScore: items file {path} not found (JSONL of context, choices, "
                                     f"label; lit/evaluation/cloze_task.py writes one)")
            self.items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.batch_size, self.metric = batch_size, metric
        self._pairs: list | None = None

    def _encoded(self, trainer) -> list[tuple[list[int], list[list[int]], int]]:
        if self._pairs is None:
            from lit.evaluation.text_codec import char_codec, codec_from_path

            data = trainer.datamodule
            if getattr(data, "tokenizer", None) is not None:  # char-level: the corpus' characters
                codec = char_codec(data.text, "the training corpus")
            else:
                codec = codec_from_path(data.tokenizer_file or data.shards_dir)
            self._pairs = [([codec.prefix_id, *codec.encode(item["context"])],
                            [codec.encode(choice) for choice in item["choices"]], int(item["label"]))
                           for item in self.items]
        return self._pairs

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        from lit.evaluation.scoring import SequenceScorer

        scorer = SequenceScorer(pl_module.model, pl_module.hparams.block_size, self.batch_size, pl_module.device)
        encoded = self._encoded(trainer)
        scores = scorer.loglikelihood([(context, choice) for context, choices, _ in encoded for choice in choices])
        correct, at = 0, 0
        for _, choices, label in encoded:
            mine = [s for s, _ in scores[at:at + len(choices)]]
            correct += max(range(len(mine)), key=mine.__getitem__) == label
            at += len(choices)
        pl_module.log(self.metric, correct / len(encoded), sync_dist=False)
