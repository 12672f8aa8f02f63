"""``cli.py lm-eval CKPT --tasks T1,T2``: a trained language model scored on lm-evaluation-harness tasks.

    python cli.py lm-eval CKPT --tasks hellaswag,arc_easy --tokenizer SHARDS_DIR_OR_TOKENIZER_JSON
    python cli.py lm-eval CKPT --tasks my_task --include-path tasks/ --config recipes/gpt_baseline.yaml

A checkpoint records the tokenizer it was trained with (its SHA-256 and path): that file is used where it still is;
``--tokenizer`` (a tokenizers JSON file, or the shards directory whose meta.json names it) or ``--config`` (the recipe
it was trained with) names it elsewhere, and another tokenizer than the recorded one is refused (``--force`` scores
with it anyway, saying so). Tasks are lm-eval's
registered ones (their data come from the Hugging Face Hub, so they need it reachable or cached) or task YAMLs in
``--include-path``. Needs the ``eval`` extra (``pip install -e '.[eval]'``).
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors


def parse(argv: list[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="cli.py lm-eval", description=(
        "Score a trained language-model checkpoint on lm-evaluation-harness tasks (loglikelihood, rolling "
        "loglikelihood and greedy generation; batched, left-truncated to the model's context)."))
    parser.add_argument("checkpoint", help="a LanguageModel checkpoint written by `cli.py fit` (any plugins)")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task names (e.g. hellaswag,arc_easy)")
    parser.add_argument("--tokenizer", default=None,
                        help="a tokenizers JSON file, or a shards directory whose meta.json names it (default: the "
                             "one the checkpoint records, where it was at training)")
    parser.add_argument("--config", default=None, help="the recipe the model was trained with (its data section)")
    parser.add_argument("--include-path", default=None, help="a folder of task YAMLs in lm-eval's format")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass")
    parser.add_argument("--limit", type=float, default=None, help="documents per task (a fraction if < 1)")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    parser.add_argument("--output", default=None, help="write lm-eval's results as JSON here")
    parser.add_argument("--force", action="store_true",
                        help="score with a tokenizer other than the one the checkpoint records (refused otherwise)")
    return parser.parse_args(argv)


def import_lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        raise UserInputError("lm-eval: lm-evaluation-harness is not installed; pip install -e '.[eval]'") from exc
    return lm_eval


def task_manager(include_path: str | None, names: list[str]):
    """lm-eval's task index with every name in ``names`` checked. The tasks of ``include_path`` alone when they are
    all there: indexing lm-eval's own thousands of task YAMLs takes tens of seconds."""
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        if not Path(include_path).is_dir():
            raise UserInputError(f"lm-eval: --include-path {include_path} is not a folder of task YAMLs")
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    manager = TaskManager(include_path=include_path)
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserInputError(f"lm-eval: unknown task '{name}'{hint}; lm-eval lists its tasks with "
                                 f"`lm-eval ls tasks`, and --include-path adds a folder of your own")
    return manager


def load_scorer(checkpoint: str, tokenizer: str | None, recipe: str | None, batch_size: int, device: str,
                force: bool = False):
    """The checkpoint's model as a SequenceScorer, and the codec its text is read with (no lm-eval needed)."""
    from lit.data import tokenizer_record
    from lit.evaluation.scoring import SequenceScorer
    from lit.evaluation.text_codec import resolve_codec
    from lit.procedures.checkpoint_io import read_trained_lm

    trained = read_trained_lm(checkpoint, "lm-eval")
    codec = resolve_codec(int(trained.hparams["vocab_size"]), tokenizer, recipe,
                          trained=tokenizer_record.in_checkpoint(trained.checkpoint), checkpoint=checkpoint,
                          force=force)
    model = trained.load().model.to(device)
    return SequenceScorer(model, int(trained.hparams["block_size"]), batch_size, device), codec


def table(results: dict) -> str:
    rows = []
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            name, _, _filter = key.partition(",")
            if name.endswith("_stderr") or name == "sample_len" or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{name}_stderr,{_filter}")
            spread = f" ± {stderr:.4f}" if isinstance(stderr, (int, float)) else ""
            rows.append(f"{task:<24} {name:<16} {value:.4f}{spread}")
    return "\n".join(rows)


@one_line_errors
def main(argv: list[str]) -> int:
    args = parse(argv)
    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    if not names:
        raise UserInputError("lm-eval: --tasks names no task")
    scorer, codec = load_scorer(args.checkpoint, args.tokenizer, args.config, args.batch_size, args.device,
                                args.force)
    lm_eval = import_lm_eval()
    from lit.evaluation.lm_eval_adapter import ArchLabLM

    manager = task_manager(args.include_path, names)
    lm = ArchLabLM(scorer, codec)
    print(f"lm-eval: {args.checkpoint} read with the {codec.description}")
    results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=args.limit,
                                      num_fewshot=args.num_fewshot, log_samples=False, bootstrap_iters=1000)
    print(table(results))
    if args.output:
        Path(args.output).write_text(json.dumps({"results": results["results"],
                                                 "configs": results.get("configs", {})}, indent=2, default=str))
        print(f"results: {args.output}")
    return 0
