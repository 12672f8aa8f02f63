"""No step that logs nothing makes the host wait for the device: counted through the real `fit` path.

Each test runs ``cli.py fit`` on a recipe made tiny, with ``tests/sync_counter.py``'s callback counting, per optimizer
step, every device -> host read of a value derived from the model or the batch, every host value sent to the
device, and every collective (see its docstring for the rule that tells a device tensor on a CPU). The steps
allowed to have any are computed here from the run's settings, not asked of the code under test:

- log steps (Lightning writes the logged metrics at the end of step s when (s + 1) % log_every_n_steps == 0),
- diagnostics records (s % interval == 0, including step 0),
- validation (after step s when (s + 1) % val_check_interval == 0), with the checkpoint that follows it,
- the last step (training ends: final checks, the final diagnostics record).

Every other step must have none, whatever the micro-batches (gradient accumulation), the progress bar or the
number of processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lit.cli import main
from tests.conftest import REPO, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
TINY = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=32",
        "--data.batch_size=4", "--trainer.enable_model_summary=false"]
STEPS, LOG_EVERY, VAL_EVERY, DIAG_EVERY = 24, 10, 12, 100  # the recipe logs every 10 and diagnoses every 100


def counting(out: Path) -> str:
    return f"--trainer.callbacks=[{{class_path: tests.sync_counter.CountSyncs, init_args: {{out: {out}}}}}]"


def fit_args(out: Path, *extra: str, micro_batches: int = 1) -> list[str]:
    # val_check_interval counts micro-batches: validation after every VAL_EVERY optimizer steps.
    return ["fit", "--config", BASELINE, *TINY, f"--trainer.max_steps={STEPS}",
            f"--trainer.accumulate_grad_batches={micro_batches}",
            f"--trainer.val_check_interval={VAL_EVERY * micro_batches}", "--trainer.limit_val_batches=2",
            counting(out), *extra]


def allowed(step: int) -> bool:
    return ((step + 1) % LOG_EVERY == 0 or step % DIAG_EVERY == 0 or (step + 1) % VAL_EVERY == 0
            or step == STEPS - 1)


def per_step(events: list[dict]) -> dict[int, Counter]:
    steps: dict[int, Counter] = {}
    for e in events:
        steps.setdefault(e["step"], Counter())[f"{e['kind']} at {e['site']}"] += 1
    return steps


def assert_quiet_between_logs(events: list[dict], micro_batches: int = 1) -> None:
    steps = per_step(events)
    noisy = {s: dict(c) for s, c in steps.items() if not allowed(s)}
    assert not noisy, f"host-device syncs on steps that log nothing: {noisy}"
    # The counter saw the run: every step ran its micro-batches, and the log steps do read the device.
    micro = {(e["step"], e["micro"]) for e in events}
    assert max(m for _, m in micro) == micro_batches - 1
    assert any(s for s in steps if (s + 1) % LOG_EVERY == 0), steps.keys()


@pytest.mark.parametrize("extra, micro_batches", [
    pytest.param([], 1, id="recipe_defaults"),  # progress bar on, diagnostics every 100, clipping 1.0
    pytest.param(["--trainer.enable_progress_bar=false", "--model.random_numbers=by_name",
                  "--trainer.gradient_clip_val=null"], 4, id="sweep_settings_accumulate_4",
                 marks=pytest.mark.slow),  # the default run's budget: one fit of these here
])
def test_no_sync_on_a_step_that_logs_nothing(workdir_with_store, extra, micro_batches):
    out = workdir_with_store / "syncs.json"
    main(fit_args(out, *extra, micro_batches=micro_batches))
    assert_quiet_between_logs(json.loads(out.read_text()), micro_batches)


@pytest.mark.slow
def test_no_sync_with_eight_micro_batches_in_bf16(workdir_with_store):
    # gpt_fineweb_track3's shape of step: 8 micro-batches, bf16 autocast, no clipping.
    out = workdir_with_store / "syncs.json"
    main(fit_args(out, "--trainer.enable_progress_bar=false", "--trainer.precision=bf16-mixed",
                  "--trainer.gradient_clip_val=null", micro_batches=8))
    assert_quiet_between_logs(json.loads(out.read_text()), 8)


@pytest.mark.slow  # two fresh processes: ~25 s of CPU
def test_no_sync_or_collective_on_a_step_that_logs_nothing_with_two_processes(tmp_path, empty_store):
    out = tmp_path / "syncs.json"
    (tmp_path / "mlflow.db").write_bytes(empty_store.read_bytes())
    proc = subprocess.run([sys.executable, str(REPO / "cli.py"), *fit_args(out, "--trainer.enable_progress_bar=false"),
                           "--config", str(REPO / "recipes" / "trainer" / "ddp.yaml"), "--trainer.devices=2",
                           "--trainer.accelerator=cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    for path in (out, Path(f"{out}.rank1")):
        events = json.loads(path.read_text())
        assert_quiet_between_logs(events)
        # The processes do agree, at log steps: the non-finite flag and the preemption decision.
        assert any(e["kind"].startswith("collective") and (e["step"] + 1) % LOG_EVERY == 0 for e in events)


@pytest.mark.slow  # one fit per recipe
@pytest.mark.parametrize("recipe", ["gpt_ngpt", "gpt_muon", "gpt_prepbn", "gpt_bhyt", "gpt_tokenformer",
                                    "gpt_hyperconn", "gpt_laurel_pa", "gpt_mup", "vit_digits", "vit_ngpt", "gpt_un",
                                    "gpt_powernorm", "vit_un"])
def test_no_sync_on_a_step_that_logs_nothing_in_recipes_with_callbacks_or_optimizers_of_their_own(workdir, recipe):
    # Renormalisation (nGPT), Muon, progress hooks (PRepBN, BHyT), muP groups, the image task's metrics.
    out = workdir / "syncs.json"
    data = ["--data.batch_size=8"] if recipe.startswith("vit") else ["--data.block_size=32", "--data.batch_size=4"]
    main(["fit", "--config", str(REPO / "recipes" / f"{recipe}.yaml"), *TINY[:3], *data,
          "--trainer.enable_model_summary=false", "--trainer.enable_progress_bar=false", "--trainer.max_steps=12",
          "--trainer.max_epochs=-1", "--trainer.log_every_n_steps=5", "--trainer.val_check_interval=null",
          "--trainer.check_val_every_n_epoch=null", "--trainer.limit_val_batches=0", "--trainer.logger=false",
          counting(out)])
    events = json.loads(out.read_text())
    noisy = {e["step"] for e in events if (e["step"] + 1) % 5 and e["step"] % DIAG_EVERY and e["step"] != 11}
    assert not noisy, [e for e in events if e["step"] in noisy]
    assert any((e["step"] + 1) % 5 == 0 for e in events)


@pytest.mark.parametrize("norm, options", [
    ("un", {"window_size": 2, "warmup_iters": 2, "compensation_start": 2, "outlier_filtration": True}),
    ("powernorm", {"warmup_iters": 2, "final_warmup_iters": 1}),
], ids=["un", "powernorm"])
def test_no_sync_in_a_training_step_of_the_batch_statistic_norms(tmp_path, norm, options):
    # UN and PowerNorm keep an iteration counter and branch on it (warmup, windows, gradient compensation, UN's outlier
    # test): decided on the device, the step reads nothing back. The counter's rules (``sync_counter``) on the model
    # step alone, no fit: four steps cross every boundary of the options above, and no step logs.
    import torch
    import torch.nn.functional as F

    from lit.models import GPT, TransformerConfig
    from tests.sync_counter import CountSyncs, _Tracker

    torch.manual_seed(0)
    model = GPT(50, 16, TransformerConfig(d_model=16, n_layers=1, n_heads=2, norm=norm, norm_options=options))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    counter = CountSyncs(str(tmp_path / "syncs.json"))
    for t in [*model.parameters(), *model.buffers()]:
        counter.mark(t)
    data = torch.Generator().manual_seed(0)
    counter._install()
    try:
        with _Tracker(counter):
            for step in range(4):
                counter._step = step
                x = torch.randint(0, 50, (2, 16), generator=data)
                counter.mark(x)
                F.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten()).backward()
                counter._mark_grads(model)
                opt.step()
                opt.zero_grad(set_to_none=True)
    finally:
        counter._uninstall()
    assert counter.events == []
    assert all(int(b) == 4 for name, b in model.named_buffers() if name.endswith("iters"))  # four steps ran


def test_no_sync_on_a_step_that_logs_nothing_on_an_image_folder_with_normalising_on_the_device(workdir):
    # The DeiT recipe's loader on real JPEGs: uint8 batches normalised and erased on the device
    # (normalize_on_device), batch mixing, the skipped-image count. 53 training images after the 1% minival, batch 4:
    # 13 steps, so the 12 steps are one epoch (Lightning resets its logged-metric states at an epoch's start, a
    # host-to-device copy once per epoch, not per step).
    from tests.conftest import make_image_folder

    folder = make_image_folder(workdir / "imagenet", classes=("a", "b", "c"), per_class=18)
    out = workdir / "syncs.json"
    main(["fit", "--config", str(REPO / "recipes" / "vit_baseline.yaml"), f"--data.root={folder}",
          "--model.variant=null", *TINY[:3], "--trainer.precision=32-true", "--data.batch_size=4",
          "--data.num_workers=0", "--data.image_size=32", "--trainer.enable_model_summary=false",
          "--trainer.enable_progress_bar=false", "--trainer.max_steps=12", "--trainer.max_epochs=-1",
          "--trainer.log_every_n_steps=5", "--trainer.limit_val_batches=0", "--trainer.logger=false",
          counting(out)])
    events = json.loads(out.read_text())
    noisy = {e["step"] for e in events if (e["step"] + 1) % 5 and e["step"] % DIAG_EVERY and e["step"] != 11}
    assert not noisy, [e for e in events if e["step"] in noisy]
    assert any((e["step"] + 1) % 5 == 0 for e in events)
