"""A small local multiple-choice task in lm-eval's task format, from text this package ships: which line follows
a line of tinyshakespeare's validation split (the true next line among lines drawn from elsewhere in the split),
HellaSwag's shape at a size that runs anywhere without the Hugging Face Hub."""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path


def cloze_items(n_items: int = 30, n_choices: int = 4, seed: int = 0) -> list[dict]:
    """``n_items`` documents {context, choices, label}: a line (ending in its newline) and candidate next lines."""
    from lit.data.text import EMBEDDED_CORPUS

    text = resources.files("lit.data").joinpath(f"{EMBEDDED_CORPUS}.txt").read_text(encoding="utf-8")
    validation = text[int(len(text) * 0.9):]  # TextDataModule's default validation split: never trained on
    lines = [line for line in validation.split("\n")[1:-1]]
    rng = random.Random(seed)
    starts = [i for i in range(len(lines) - 1) if len(lines[i]) >= 20 and len(lines[i + 1]) >= 20]
    pool = [line for line in lines if len(line) >= 20]
    items = []
    for i in rng.sample(starts, n_items):
        truth = lines[i + 1]
        wrong = rng.sample([line for line in pool if line != truth], n_choices - 1)
        label = rng.randrange(n_choices)
        choices = wrong[:label] + [truth] + wrong[label:]
        items.append({"context": lines[i] + "\n", "choices": choices, "label": label})
    return items


def write_cloze_task(folder: str | Path, name: str = "shakespeare_cloze", n_items: int = 30, seed: int = 0) -> Path:
    """Write ``name``.yaml and its data (JSONL) into ``folder`` (lm-eval's ``--include-path``); returns the YAML."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in cloze_items(n_items, seed=seed)))
    task = folder / f"{name}.yaml"
    task.write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data.resolve()))}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: choices
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
""")
    return task
