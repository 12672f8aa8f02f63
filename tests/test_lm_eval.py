"""Downstream evaluation (``cli.py lm-eval``): the scorer's rules over token ids checked against the model's logits by
hand (no lm-eval needed), the text codec and its refusals, and with lm-evaluation-harness installed (the ``eval``
extra) ``simple_evaluate`` end to end on a local multiple-choice task in lm-eval's format, against our own count."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys

import pytest
import torch
import torch.nn.functional as F

from lit.evaluation.scoring import SequenceScorer
from lit.evaluation.text_codec import char_codec, codec_from_path, resolve_codec
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig
from tests.conftest import REPO, assert_refused_in_one_line

BLOCK = 12
VOCAB = 65  # tinyshakespeare's characters


def tiny_lm(seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(vocab_size=VOCAB, block_size=BLOCK, arch=TransformerConfig(d_model=16, n_layers=2, n_heads=2))


def trained_checkpoint(path, steps: int = 30):
    """A char-level model trained a few steps on tinyshakespeare by hand (no Trainer: seconds), saved as
    ``fit`` saves one (hyperparameters with the class path, and the weights)."""
    from lit.data.text import TextDataModule

    module = tiny_lm()
    tokens = torch.tensor(TextDataModule(block_size=BLOCK).tokenizer.encode(
        TextDataModule(block_size=BLOCK).text[:20000]))
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - BLOCK - 1, (16,), generator=generator)
        batch = torch.stack([tokens[s:s + BLOCK + 1] for s in starts])
        loss = F.cross_entropy(module(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hparams = {**dict(module.hparams), "arch": dataclasses.asdict(module.hparams.arch),
               "_class_path": "lit.language_model.LanguageModel"}
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": hparams}, path)
    return module.eval()


def by_hand(module, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context) from one forward over the last BLOCK + 1 tokens, position by position."""
    window = (context + continuation)[-(BLOCK + 1):]
    log_probs = F.log_softmax(module(torch.tensor([window[:-1]])).float(), -1)[0]
    start = len(window) - 1 - len(continuation)
    return sum(log_probs[start + i, t].item() for i, t in enumerate(continuation))


def requests(seed: int = 1) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [(1, 1), (3, 4), (20, 2), (5, 7), (2, 3), (11, 1), (30, 5)]  # contexts past BLOCK are left-truncated
    return [(torch.randint(0, VOCAB, (c,), generator=g).tolist(), torch.randint(0, VOCAB, (k,), generator=g).tolist())
            for c, k in lengths]


def test_loglikelihood_is_the_continuations_log_probs_from_the_logits_and_batching_changes_nothing():
    module = tiny_lm().eval()
    pairs = requests()
    one = SequenceScorer(module.model, BLOCK, batch_size=1).loglikelihood(pairs)
    batched = SequenceScorer(module.model, BLOCK, batch_size=4).loglikelihood(pairs)
    with torch.no_grad():
        for (context, continuation), (logprob, _) in zip(pairs, one, strict=True):
            assert logprob == pytest.approx(by_hand(module, context, continuation), abs=1e-5)
    assert [b[1] for b in batched] == [o[1] for o in one]
    torch.testing.assert_close(torch.tensor([b[0] for b in batched]), torch.tensor([o[0] for o in one]),
                               atol=1e-5, rtol=0)


def test_greedy_flag_is_true_exactly_when_the_continuation_is_the_argmax():
    module = tiny_lm().eval()
    context = [3, 17, 40, 2]
    with torch.no_grad():
        best = module(torch.tensor([context]))[0, -1].argmax().item()
    scorer = SequenceScorer(module.model, BLOCK)
    assert scorer.loglikelihood([(context, [best])])[0][1] is True
    assert scorer.loglikelihood([(context, [(best + 1) % VOCAB])])[0][1] is False


def test_rolling_scores_every_token_once_in_windows_of_the_context_length():
    module = tiny_lm().eval()
    doc = torch.randint(0, VOCAB, (2 * BLOCK + 5,), generator=torch.Generator().manual_seed(2)).tolist()
    prefix = 0
    scorer = SequenceScorer(module.model, BLOCK, batch_size=2)
    sequence = [prefix, *doc]
    with torch.no_grad():  # windows of BLOCK predictions: tokens 1..12 after the prefix, 13..24, then 25..29
        expected = sum(by_hand(module, sequence[:p], sequence[p:p + BLOCK]) for p in (1, 1 + BLOCK, 1 + 2 * BLOCK))
    assert scorer.loglikelihood_rolling([doc, []], prefix) == [pytest.approx(expected, abs=1e-4), 0.0]
    # A continuation longer than the context is scored the same way after its context.
    assert scorer.loglikelihood([([prefix], doc)])[0][0] == pytest.approx(expected, abs=1e-4)


def test_greedy_generation_is_the_models_own_and_stops_after_the_stop_condition():
    module = tiny_lm().eval()
    scorer = SequenceScorer(module.model, BLOCK)
    with torch.no_grad():
        reference = module.model.generate(torch.tensor([[5, 6, 7]]), 20, temperature=0)[0, 3:].tolist()
    assert scorer.greedy([5, 6, 7], 20, chunk=6) == reference
    stopped = scorer.greedy([5, 6, 7], 20, done=lambda ids: len(ids) >= 3, chunk=4)
    assert stopped == reference[:4]


def test_greedy_batches_decode_each_context_as_alone_in_fewer_calls(monkeypatch):
    module = tiny_lm(seed=1).eval()
    scorer = SequenceScorer(module.model, BLOCK, batch_size=3)
    g = torch.Generator().manual_seed(0)
    contexts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 1, 5, 20)]
    max_new = 5
    # lm-eval's rule: the context keeps its last block_size - max_new tokens, so nothing slides.
    alone = [scorer.greedy(c[-(BLOCK - max_new):], max_new) for c in contexts]
    calls, generate = [], module.model.generate

    def counted(idx, *args, **kwargs):
        calls.append(idx.shape)
        return generate(idx, *args, **kwargs)

    monkeypatch.setattr(module.model, "generate", counted)
    assert scorer.greedy_batch(contexts, max_new) == alone
    assert [shape[0] for shape in calls] == [3, 2]  # five contexts, batches of three, longest first
    # A batch ends after the chunk in which every row is done.
    calls.clear()
    stopped = scorer.greedy_batch(contexts[:2], 7, done=lambda ids: len(ids) >= 2, chunk=3)
    assert [len(ids) for ids in stopped] == [3, 3] and len(calls) == 1
    # A model that cannot keep a KV cache decodes one context at a time, to the same tokens.
    module.model.train()
    with pytest.warns(UserWarning, match="training mode"):
        assert scorer.greedy_batch(contexts[:2], max_new) == alone[:2]


def test_codecs_and_their_one_line_refusals(tmp_path):
    from lit.data.tokenizer_training import train_tokenizer
    from lit.errors import UserInputError

    codec = resolve_codec(VOCAB, None, str(REPO / "recipes" / "gpt_baseline.yaml"))
    assert codec.decode(codec.encode("To be, or not")) == "To be, or not" and codec.decode([codec.prefix_id]) == "\n"
    with pytest.raises(UserInputError, match="records no tokenizer"):
        resolve_codec(VOCAB, None, None)
    with pytest.raises(UserInputError, match="65 tokens but the checkpoint's vocabulary is 64"):
        resolve_codec(64, None, str(REPO / "recipes" / "gpt_baseline.yaml"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. " * 50)
    train_tokenizer([str(corpus)], str(tmp_path / "tokenizer.json"), vocab_size=300)
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "meta.json").write_text(json.dumps({"tokenizer": str(tmp_path / "tokenizer.json"), "eot_id": 0}))
    bpe = codec_from_path(shards)
    assert bpe.decode(bpe.encode("the cat sat")) == "the cat sat" and bpe.prefix_id == 0
    assert resolve_codec(bpe.vocab_size + 7, str(shards), None).vocab_size == bpe.vocab_size  # padded vocabularies fit
    with pytest.raises(UserInputError, match="give the tokenizer the model was trained with"):
        resolve_codec(bpe.vocab_size - 1, str(tmp_path / "tokenizer.json"), None)
    with pytest.raises(UserInputError, match="no meta.json naming a tokenizer"):
        codec_from_path(tmp_path)
    assert char_codec("ab\n", "x").prefix_id == 0


def test_lm_eval_refuses_in_one_line(workdir, capsys):
    assert_refused_in_one_line(workdir, capsys, ["lm-eval", "missing.ckpt", "--tasks", "x", "--config",
                                                 str(REPO / "recipes" / "gpt_baseline.yaml")], "checkpoint not found")


needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-evaluation-harness is the `eval` extra (pip install -e '.[eval]')")


def test_lm_eval_without_the_harness_says_how_to_install_it(workdir, capsys, monkeypatch):
    trained_checkpoint(workdir / "tiny.ckpt", steps=1)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if not installed
    assert_refused_in_one_line(workdir, capsys, ["lm-eval", "tiny.ckpt", "--tasks", "hellaswag", "--config",
                                                 str(REPO / "recipes" / "gpt_baseline.yaml")],
                               "pip install -e '.[eval]'")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm_eval") / "tiny.ckpt"
    return path, trained_checkpoint(path)


@needs_lm_eval
def test_lm_eval_refuses_a_model_without_a_tokenizer(workdir, capsys, checkpoint):
    assert_refused_in_one_line(workdir, capsys, ["lm-eval", str(checkpoint[0]), "--tasks", "hellaswag"],
                               "records no tokenizer")


@needs_lm_eval
@pytest.mark.slow  # indexing lm-eval's own task YAMLs takes about 30 s here
def test_lm_eval_refuses_an_unknown_task(workdir, capsys, checkpoint):
    assert_refused_in_one_line(workdir, capsys, ["lm-eval", str(checkpoint[0]), "--tasks", "hellaswagg", "--config",
                                                 str(REPO / "recipes" / "gpt_baseline.yaml")],
                               "unknown task 'hellaswagg' (did you mean 'hellaswag'?)")


@needs_lm_eval
def test_simple_evaluate_on_a_local_multiple_choice_task_matches_our_own_count(workdir, capsys, checkpoint,
                                                                               monkeypatch):
    from lit.commands import main
    from lit.evaluation.cloze_task import write_cloze_task

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    task = write_cloze_task(workdir / "tasks", n_items=24)
    path, module = checkpoint
    main(["lm-eval", str(path), "--tasks", "shakespeare_cloze", "--include-path", str(task.parent), "--config",
          str(REPO / "recipes" / "gpt_baseline.yaml"), "--batch-size", "8", "--output", "results.json"])
    assert "shakespeare_cloze" in capsys.readouterr().out
    reported = json.loads((workdir / "results.json").read_text())["results"]["shakespeare_cloze"]
    # Our own count: the choice with the highest log-likelihood after the line is the answer.
    codec = resolve_codec(VOCAB, None, str(REPO / "recipes" / "gpt_baseline.yaml"))
    scorer = SequenceScorer(module.model, BLOCK)
    docs = [json.loads(line) for line in (task.parent / "shakespeare_cloze.jsonl").read_text().splitlines()]
    correct = 0
    for doc in docs:
        scores = [s for s, _ in scorer.loglikelihood([(codec.encode(doc["context"]), codec.encode(choice))
                                                      for choice in doc["choices"]])]
        correct += max(range(len(scores)), key=scores.__getitem__) == doc["label"]
    assert reported["acc,none"] == pytest.approx(correct / len(docs))
    assert 0.25 < correct / len(docs)  # a few steps of training read Shakespeare's lines better than chance


@needs_lm_eval
def test_adapter_generate_until_and_rolling_through_lm_evals_request_shape():
    from types import SimpleNamespace

    from lit.evaluation.lm_eval_adapter import ArchLabLM

    module = tiny_lm(seed=3).eval()
    codec = resolve_codec(VOCAB, None, str(REPO / "recipes" / "gpt_baseline.yaml"))
    lm = ArchLabLM(SequenceScorer(module.model, BLOCK, batch_size=3), codec)
    context = "ROMEO:"
    with torch.no_grad():  # after the document-start token, as predict does
        ids = torch.tensor([[codec.prefix_id, *codec.encode(context)]])
        full = codec.decode(module.model.generate(ids, 30, temperature=0)[0, ids.size(1):].tolist())
    stop = full[5]  # a character the greedy text reaches, so the stop cuts it
    [text] = lm.generate_until([SimpleNamespace(args=(context, {"until": [stop], "max_gen_toks": 30}))])
    assert text == full.split(stop)[0] and len(text) < 30
    # Requests batched by their generation arguments come back in the order asked, each as if asked alone.
    asked = [("JULIET:", {"until": ["\n"], "max_gen_toks": 6}), ("ROMEO:", {"until": [stop], "max_gen_toks": 4}),
             ("KING HENRY", {"until": ["\n"], "max_gen_toks": 6}), ("O", {"until": ["\n"], "max_gen_toks": 6})]
    together = lm.generate_until([SimpleNamespace(args=a) for a in asked])
    assert together == [lm.generate_until([SimpleNamespace(args=a)])[0] for a in asked]
    docs = ["To be, or not to be", "First Citizen:\nBefore we proceed any further, hear me speak."]
    rolled = lm.loglikelihood_rolling([SimpleNamespace(args=(d,)) for d in docs])
    with torch.no_grad():
        assert rolled == pytest.approx([SequenceScorer(module.model, BLOCK).loglikelihood(
            [([codec.prefix_id], codec.encode(d))])[0][0] for d in docs], abs=1e-4)


def test_multiple_choice_score_is_logged_at_validation_as_our_own_count(workdir):
    from lit.commands import main
    from lit.evaluation.cloze_task import write_cloze_task

    task = write_cloze_task(workdir / "tasks", n_items=12)
    items = task.parent / "shakespeare_cloze.jsonl"
    cli = main(["fit", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"), "--model.arch.d_model=16",
                "--model.arch.n_layers=2", "--model.arch.n_heads=2", f"--data.block_size={BLOCK}",
                "--data.batch_size=2", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                "--trainer.logger=false", "--trainer.limit_val_batches=1", "--model.diagnostics.interval=0",
                "--trainer.max_steps=2", "--trainer.val_check_interval=2", f"--checkpoint.dirpath={workdir / 'ck'}",
                "--trainer.callbacks+=lit.evaluation.multiple_choice_callback.MultipleChoiceScore",
                f"--trainer.callbacks.init_args.items={items}"])
    codec = resolve_codec(VOCAB, None, str(REPO / "recipes" / "gpt_baseline.yaml"))
    scorer = SequenceScorer(cli.model.model, BLOCK)
    docs = [json.loads(line) for line in items.read_text().splitlines()]
    correct = 0
    for doc in docs:
        scores = [s for s, _ in scorer.loglikelihood([([codec.prefix_id, *codec.encode(doc["context"])],
                                                       codec.encode(c)) for c in doc["choices"]])]
        correct += max(range(len(scores)), key=scores.__getitem__) == doc["label"]
    assert cli.trainer.callback_metrics["val/mc_acc"].item() == pytest.approx(correct / len(docs))
