"""``--model.compile`` (lit/compile_mode.py, lit/task.py): false / true / reduce-overhead / auto, auto the default.

On a CPU ``auto`` is eager and changes nothing (a fit with the default equals a ``false`` fit bit for bit); what
``auto`` picks on CUDA, and its fallbacks (a plugin that declared it cannot be captured, gradient accumulation), are
checked on the resolution itself, which takes the device as an argument. The CUDA-graph path's routing (training
forward in the graphs, everything else outside) is checked with torch.compile recorded, so no compile is paid.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from arch_plugins.graph_capture import capture_refusals, declare_not_capturable
from lit import compile_mode
from lit.cli import main
from lit.compile_mode import AUTO, DEFAULT, EAGER, GRAPHS, parse, resolve
from lit.errors import UserInputError
from lit.parallel import compile_model
from tests.conftest import REPO, assert_refused_in_one_line

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
TINY = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=32",
        "--data.batch_size=4", "--trainer.max_steps=4", "--trainer.limit_val_batches=1",
        "--trainer.val_check_interval=4", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0"]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


class Tiny(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.body = nn.Linear(width, width)

    def forward(self, x):
        return self.body(x).relu()


class Uncapturable(Tiny):
    """Stands for a plugin that declared it cannot run inside a CUDA graph."""

    def __init__(self):
        super().__init__()
        declare_not_capturable(self.body, "stateful_norm", "writes a buffer in its custom backward")


def fit(*extra: str):
    return main(["fit", "--config", BASELINE, *TINY, *extra])


def test_auto_is_the_default_and_on_cpu_trains_bit_for_bit_as_eager(workdir_with_store):
    default = fit()
    assert default.model.compile_requested == AUTO and default.model.compiled is EAGER
    weights = {k: v.clone() for k, v in default.model.state_dict().items()}
    eager = fit("--model.compile=false")
    assert eager.model.compiled is EAGER
    for name, tensor in eager.model.state_dict().items():
        assert torch.equal(weights[name], tensor), name  # bit for bit
    # The run says how it ran.
    from mlflow import MlflowClient

    params = [r.data.params for r in MlflowClient("sqlite:///mlflow.db").search_runs(
        [e.experiment_id for e in MlflowClient("sqlite:///mlflow.db").search_experiments()])]
    assert sorted(p.get("model/compile_resolved") for p in params) == ["false", "false"]


def test_a_bad_value_is_one_error_line(workdir, capsys):
    assert_refused_in_one_line(workdir, capsys, ["fit", "--config", BASELINE, *TINY, "--model.compile=fast"],
                               "--model.compile takes true, false, reduce-overhead or auto")


@pytest.mark.parametrize("value, expected", [(True, DEFAULT), (False, EAGER), ("true", DEFAULT), ("False", EAGER),
                                             ("auto", AUTO), ("reduce-overhead", GRAPHS)])
def test_values(value, expected):
    assert parse(value) == expected and type(parse(value)) is type(expected)


def test_the_command_line_reads_true_and_false_as_before():
    from jsonargparse import ArgumentParser

    from lit.language_model import LanguageModel

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(LanguageModel, "model", skip={"arch", "growth", "diagnostics"})
    for flag, expected in (("true", True), ("false", False), ("auto", "auto"), ("reduce-overhead", GRAPHS)):
        got = parser.parse_args([f"--model.compile={flag}"]).model.compile
        assert got == expected and type(got) is type(expected), flag
    assert parser.parse_args([]).model.compile == AUTO


def test_auto_resolves_by_device_size_processes_and_accumulation():
    small = Tiny()
    with torch.device("meta"):
        large = nn.Linear(8000, compile_mode.CUDA_GRAPH_MAX_PARAMETERS // 8000)  # the threshold, bias on top
    assert resolve(AUTO, small, CPU).mode is EAGER
    assert resolve(AUTO, small, CUDA).mode == GRAPHS
    assert resolve(AUTO, large, CUDA).mode is DEFAULT
    assert resolve(AUTO, small, CUDA, processes=2).mode is DEFAULT
    with pytest.warns(UserWarning, match="4 micro-batches per step accumulate gradients"):
        assert resolve(AUTO, small, CUDA, micro_batches=4).mode is DEFAULT
    for asked in (True, False):  # what was asked is what runs
        assert resolve(asked, small, CUDA).mode is asked and resolve(asked, small, CPU).mode is asked


@pytest.mark.parametrize("asked", [AUTO, GRAPHS])
def test_a_plugin_that_cannot_be_captured_falls_back_to_true_with_one_warning_naming_it(asked):
    model = nn.Sequential(Tiny(), Uncapturable(), Uncapturable())  # declared twice, said once
    assert [(r.plugin, r.module) for r in capture_refusals(model)] == [("stateful_norm", "1.body")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolution = resolve(asked, model, CUDA)
    assert resolution.mode is DEFAULT and "stateful_norm" in resolution.why
    assert len(caught) == 1
    assert "stateful_norm (1.body): writes a buffer in its custom backward" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve(AUTO, model, CPU).mode is EAGER  # no graphs were asked for: nothing to say


def test_no_registered_plugin_refuses_capture_today():
    """The built-in plugins were read for what breaks a CUDA graph (docs/performance/compile-cache.md): none declares.
    A plugin that starts to must say so on that page; this keeps the page and the code in step."""
    from arch_plugins import registry
    from arch_plugins.testing.stacks import Size
    from lit.models import conformance

    refusing = set()
    for kind in ("norm", "residual", "projection"):
        for name in registry.names(kind):
            needed = getattr(registry.load(kind, name), "stack_options", {}).get("gpt", {})
            built = conformance.gpt({kind: (name, needed)}, Size(d_model=48, n_heads=3, n_layers=2))
            if capture_refusals(built.model):
                refusing.add(name)
    assert refusing == set()


def record_compiles(monkeypatch):
    """torch.compile replaced by a recorder: each compiled callable runs eagerly and logs (mode, training, grad)."""
    calls, marks = [], []
    real = torch.compile

    def fake_compile(fn, **kwargs):
        mode = kwargs.get("mode")

        def compiled(*args, **kw):
            calls.append((mode, torch.is_grad_enabled()))
            return fn(*args, **kw)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(len(calls)))
    return calls, marks, real


def test_the_graph_path_runs_the_training_step_in_the_graphs_and_evaluation_outside(monkeypatch):
    calls, marks, _ = record_compiles(monkeypatch)
    model, reference = Tiny(), Tiny()
    reference.load_state_dict(model.state_dict())
    compile_model(model, mode=GRAPHS)
    x = torch.randn(3, 8)
    for _ in range(2):
        model(x).sum().backward()
    model.eval()
    with torch.no_grad():
        evaluated = model(x[:1])  # another shape, as a last validation batch may be
    model.train()
    with torch.no_grad():
        model(x)  # a forward without gradients in training mode (a probe): outside too
    assert calls == [(GRAPHS, True), (GRAPHS, True), (None, False), (None, False)]
    assert marks == [0, 1]  # a new step for the graphs before each training forward, and only then
    assert torch.equal(evaluated, reference(x[:1]).detach())
    reference(x).sum().backward()
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_true_compiles_without_graphs(monkeypatch):
    calls, marks, _ = record_compiles(monkeypatch)
    model = Tiny()
    compile_model(model)
    model(torch.randn(2, 8)).sum().backward()
    assert calls == [(None, True)] and marks == []


def test_training_batches_keep_one_shape(workdir):
    """CUDA graphs replay fixed shapes: the training loader drops the last partial batch (lit/data/resumable.py's
    ``drop_last``, the default of every training loader), so every step has the same shape."""
    from lit.data import TextDataModule

    data = TextDataModule(block_size=200, batch_size=48)
    data.setup("fit")
    assert len(data.train_set) % 48 != 0  # there is a partial batch to drop
    shapes = {tuple(x.shape) for x, _ in data.train_dataloader()}
    assert shapes == {(48, 200)}


def test_parse_rejects_other_types():
    with pytest.raises(UserInputError):
        parse(1)


def test_the_graph_path_reads_nothing_from_the_device_on_a_step_that_logs_nothing(workdir_with_store, monkeypatch):
    """The sync counter (tests/sync_counter.py) over a real fit on the CUDA-graph path's host side: torch.compile
    recorded (it runs eagerly), so every step is counted; inside a graph nothing can read the host (a read would break
    the one graph, ``fullgraph=True``)."""
    import json

    from tests.test_syncs import assert_quiet_between_logs, fit_args

    calls, marks, _ = record_compiles(monkeypatch)
    out = workdir_with_store / "syncs.json"
    main(fit_args(out, "--model.compile=reduce-overhead"))
    assert_quiet_between_logs(json.loads(out.read_text()))
    assert (GRAPHS, True) in calls and (None, False) in calls and len(marks) == calls.count((GRAPHS, True))
