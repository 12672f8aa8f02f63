"""The command line: plugin listing, training by recipe, sampling from a checkpoint, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lit.cli import main
from tests.conftest import REPO, TINY_LM, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
NO_LOGGER = ["--trainer.logger=false"]


def test_plugins_command_lists_the_builtins():
    out = subprocess.run([sys.executable, "cli.py", "plugins"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["KIND", "NAME", "PACKAGE", "VERSION"]
    for kind, name in [("norm", "layernorm"), ("norm", "rmsnorm"), ("residual", "add"), ("projection", "linear"),
                       ("residual", "attnres"), ("residual", "attnres_block"), ("residual", "hyperconn"),
                       ("residual", "hyperconn_static")]:
        row = next(line.split() for line in lines if line.split()[:2] == [kind, name])
        assert row[2] == "arch-lab" and row[3][0].isdigit() and len(row) > 4  # package, version, description


@pytest.mark.parametrize("args, expected", [
    (["--model.arch.norm=rmsnrom"], "unknown norm 'rmsnrom'; did you mean 'rmsnorm'?"),
    (["--model.arch.norm_options.epsilon=1e-5"], "has no option 'epsilon'; did you mean 'eps'?"),
    (["--model.arch.residual=addd"], "unknown residual 'addd'; did you mean 'add'?"),
    (["--model.arch.d_modle=3"], "unrecognized arguments: --arch.d_modle=3"),
    (["--trainer.max_stepz=3"], "unrecognized arguments: --trainer.max_stepz=3"),
    (["--data.text_file=missing.txt"], "text file missing.txt not found"),
])
def test_bad_input_is_one_line(workdir, capsys, args, expected):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", BASELINE, *args, "--trainer.fast_dev_run=true", *NO_LOGGER])
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and expected in err[0], err


def test_unknown_key_in_a_recipe_file(workdir, capsys):
    bad = workdir / "bad.yaml"
    bad.write_text(Path(BASELINE).read_text().replace("mlp: swiglu", "mlpp: swiglu"))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(bad), "--trainer.fast_dev_run=true"])
    assert "Group 'arch' does not accept option 'mlpp'" in capsys.readouterr().err


def test_fit_then_sample_from_the_checkpoint(workdir, capsys):
    main(["fit", "--config", BASELINE, *TINY_LM, *NO_LOGGER, "--trainer.max_steps=4",
          "--trainer.val_check_interval=4", "--trainer.limit_val_batches=1",
          f"--trainer.default_root_dir={workdir}"])
    ckpt = workdir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    capsys.readouterr()
    main(["predict", "--config", BASELINE, *TINY_LM, *NO_LOGGER, "--ckpt_path", str(ckpt),
          "--model.max_new_tokens=40", "--model.top_k=5", "--data.prompt=ROMEO:", "--data.num_samples=2"])
    samples = [line for line in capsys.readouterr().out.split("ROMEO:") if line.strip()]
    assert len(samples) >= 2 and all(len(s) > 20 for s in samples[:2])


def test_a_bad_flag_is_one_line_without_lightnings_argv_warning():
    """cli.py hands LightningCLI the process's own arguments on purpose; Lightning's warning about args given beside
    sys.argv echoed the whole command line twice, before the error line too."""
    out = subprocess.run([sys.executable, "cli.py", "fit", "--config", BASELINE, "--model.arch.norm=rmsnrom",
                          "--trainer.fast_dev_run=true", *NO_LOGGER], cwd=REPO, capture_output=True, text=True,
                         env=subprocess_env())
    assert out.returncode == 2
    assert "args parameter" not in out.stderr and "sys.argv" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if line.startswith("error:")]) == 1
