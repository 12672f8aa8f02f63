"""The conformance kit fails the plugins it should: one broken plugin per check, and its command line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from arch_plugins import registry
from arch_plugins.init_identity import InitIdentity
from arch_plugins.norms.prenorm import PreNorm
from arch_plugins.residuals.add import Add, AddResidual
from arch_plugins.testing import CHECKS, Size, Skipped, check, conformance_cases
from arch_plugins.testing.__main__ import main
from arch_plugins.testing.stacks import stacks
from lit.models import conformance
from tests.conftest import subprocess_env

SMALL = Size(d_model=24, n_heads=3, n_layers=2)


@pytest.fixture(scope="module")
def gpt_only():
    return {"gpt": conformance.gpt}


def test_arch_lab_registers_its_stacks_for_the_kit():
    # Fails with "reinstall arch-lab" when the installed metadata predates the entry points.
    assert stacks() == {"gpt": conformance.gpt, "vit": conformance.vit}


@pytest.fixture
def register():
    added = []

    def add(kind, name, cls):
        registry.register(kind, name, cls)
        added.append((kind, name))

    yield add
    for kind, name in added:
        registry.unregister(kind, name)


def norm_plugin(module_factory, doc="A norm for the kit's own tests."):
    class Strategy(PreNorm):
        def make_norm(self, dim):
            return module_factory(dim)

    Strategy.__doc__ = doc
    return Strategy


def outcome(kind, name, check_name, stacks, **kw) -> tuple[str, str]:
    (result,) = check(kind, name, checks=[check_name], stacks=stacks, size=SMALL, **kw)
    return result.status, result.detail


def test_a_built_in_passes_every_fast_check(gpt_only):
    results = check("norm", "rmsnorm", stacks=gpt_only, size=SMALL)
    assert {r.check: r.status for r in results} == {
        "listing": "pass", "forward_backward": "pass", "init_identity": "skip", "reload": "pass",
        "determinism": "pass", "train_eval": "pass", "distributed": "skip", "meta": "pass"}


def test_listing_needs_a_docstring_of_its_own_and_defaults(register, gpt_only):
    register("norm", "undocumented", norm_plugin(nn.RMSNorm, doc=None))
    assert outcome("norm", "undocumented", "listing", gpt_only) == (
        "fail", "AssertionError: Strategy has no docstring: its first line is the plugin's description in the listing")

    class Required(PreNorm):
        """Needs an option to build."""

        def __init__(self, eps: float):
            self.eps = eps

    register("norm", "required", Required)
    status, detail = outcome("norm", "required", "listing", gpt_only)
    assert status == "fail" and "option 'eps' has no default" in detail


class Unused(nn.RMSNorm):
    def __init__(self, dim):
        super().__init__(dim)
        self.forgotten = nn.Parameter(torch.ones(dim))


class Infinite(nn.RMSNorm):
    def forward(self, x):
        return super().forward(x) / 0.0


def test_forward_backward_needs_finite_values_and_a_gradient_everywhere(register, gpt_only):
    register("norm", "unused", norm_plugin(Unused))
    status, detail = outcome("norm", "unused", "forward_backward", gpt_only)
    assert status == "fail" and "forgotten gets no gradient" in detail
    register("norm", "infinite", norm_plugin(Infinite))
    status, detail = outcome("norm", "infinite", "forward_backward", gpt_only)
    assert status == "fail" and "non-finite output" in detail


class Leaky(Add):
    def forward(self, h, branch, history):
        return h + 1.001 * branch


def test_a_false_init_identity_fails_exact_or_not(register, gpt_only):
    for exact in (True, False):
        class LeakyResidual(AddResidual):
            """Claims to be `add` at init; is not."""

            init_identities = (InitIdentity("add", exact=exact),)

            def merge(self, sublayer, layer, stack):
                return Leaky()

        register("residual", f"leaky_{exact}", LeakyResidual)
        status, detail = outcome("residual", f"leaky_{exact}", "init_identity", gpt_only)
        assert status == "fail", detail
    # And a true one holds (the kit's comparison is not always-failing either).
    assert outcome("residual", "hyperconn", "init_identity", gpt_only) == ("pass", "")


class Hidden(nn.RMSNorm):
    """Keeps a training statistic in a plain attribute: lost by a state dict."""

    def __init__(self, dim):
        super().__init__(dim)
        self.peak = 1.0

    def forward(self, x):
        if self.training:
            self.peak = 1.0 + x.detach().abs().max().item()
        return super().forward(x) * self.peak


def test_reload_catches_state_outside_the_state_dict(register, gpt_only):
    register("norm", "hidden", norm_plugin(Hidden))
    status, detail = outcome("norm", "hidden", "reload", gpt_only)
    assert status == "fail" and "reloaded model computes something else" in detail


class Unseeded(nn.RMSNorm):
    def __init__(self, dim):
        super().__init__(dim)
        with torch.no_grad():  # from the operating system's entropy, which torch.manual_seed does not reach
            self.weight.add_(int.from_bytes(os.urandom(4), "little") / 2**32)


def test_determinism_catches_randomness_outside_the_seed(register, gpt_only):
    register("norm", "unseeded", norm_plugin(Unseeded))
    status, detail = outcome("norm", "unseeded", "determinism", gpt_only)
    assert status == "fail" and "two builds under one seed differ" in detail


class Counting(nn.RMSNorm):
    def __init__(self, dim):
        super().__init__(dim)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1  # even in eval mode
        return super().forward(x) * (1 + 1e-3 * self.calls)


def test_train_eval_catches_state_that_eval_changes(register, gpt_only):
    register("norm", "counting", norm_plugin(Counting))
    status, detail = outcome("norm", "counting", "train_eval", gpt_only)
    assert status == "fail" and "two eval passes on one batch differ" in detail


class AsksAutocastAboutItsInput(nn.RMSNorm):
    """Turns autocast off on its input's device, as a plugin that keeps its arithmetic in fp32 would: fine on a CPU
    or a GPU, refused by torch on the meta device."""

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x)


class ReadsAValueOnTheHost(nn.RMSNorm):
    def forward(self, x):
        return super().forward(x) * (2.0 if x.abs().max().item() > 1e6 else 1.0)


def test_meta_catches_a_forward_that_only_runs_on_real_devices(register, gpt_only):
    register("norm", "autocast_asker", norm_plugin(AsksAutocastAboutItsInput))
    status, detail = outcome("norm", "autocast_asker", "meta", gpt_only)
    assert status == "fail" and "RuntimeError" in detail
    register("norm", "host_reader", norm_plugin(ReadsAValueOnTheHost))
    status, detail = outcome("norm", "host_reader", "meta", gpt_only)
    assert status == "fail"
    # The same plugin asking through arch_plugins.autocast passes.
    from arch_plugins.autocast import autocast_off

    class AsksSafely(nn.RMSNorm):
        def forward(self, x):
            with autocast_off(x.device.type):
                return super().forward(x)

    register("norm", "safe_asker", norm_plugin(AsksSafely))
    assert outcome("norm", "safe_asker", "meta", gpt_only) == ("pass", "")


# Options under which the statistics reach the output and the gradients at once (BatchNorm's affine off zero, RepBN's
# alpha mixing in, the transition under way), and BHyT's c_attn recomputed after the weights have moved.
PREPBN = {"alpha_init": 0.5, "bn_zero_init": False, "transition_steps": 2}


def test_distributed_catches_unsynchronised_batch_statistics(gpt_only):
    assert outcome("norm", "prepbn", "distributed", gpt_only, options=PREPBN) == ("pass", "")
    # PRepBN's own option: each rank then normalises by its half of the batch, and the statistics part.
    status, detail = outcome("norm", "prepbn", "distributed", gpt_only, options={**PREPBN, "sync": False})
    assert status == "fail" and "is not one process's on the whole batch" in detail


def test_distributed_bhyt_refresh_agrees_across_ranks(gpt_only):
    assert outcome("norm", "bhyt", "distributed", gpt_only, options={"refresh_every": 1}) == ("pass", "")


def test_the_distributed_check_runs_after_a_flop_count_in_the_same_process(gpt_only):
    # Every fit counts its FLOPs; counting under FakeTensorMode started autograd's device threads, and the ranks this
    # check forks then failed their backward pass ("autograd's threading in combination with fork").
    from lit.compute import gpt_flops_per_token
    from lit.models.gpt import GPT
    from lit.models.transformer import TransformerConfig

    gpt_flops_per_token(GPT(vocab_size=11, block_size=8, arch=TransformerConfig(d_model=16, n_layers=1, n_heads=2)))
    assert outcome("norm", "bhyt", "distributed", gpt_only, options={"refresh_every": 1}) == ("pass", "")


def test_a_stateless_plugin_skips_the_distributed_check_under_pytest(gpt_only):
    (case,) = conformance_cases("norm", "rmsnorm", checks=["distributed"], stacks=gpt_only, size=SMALL)
    with pytest.raises(pytest.skip.Exception, match="keeps no state outside its parameters"):
        case.run()
    with pytest.raises(Skipped):  # outside pytest the check raises the kit's own exception
        CHECKS["distributed"](case.subject())


def test_command_line_table_and_exit_codes(capsys, register):
    assert main(["norm", "rmsnorm", "--check", "listing", "--check", "init_identity"]) == 0
    out = capsys.readouterr().out
    assert "norm  rmsnorm  listing        PASS" in out and "declares no init identity" in out

    register("norm", "undocumented", norm_plugin(nn.RMSNorm, doc=None))
    assert main(["norm", "undocumented", "--check", "listing"]) == 1
    assert "1 failed" in capsys.readouterr().out

    assert main(["norm", "rmsnrom"]) == 2
    assert capsys.readouterr().err == ("error: unknown norm 'rmsnrom'; did you mean 'rmsnorm'? available: "
                                       + ", ".join(registry.names("norm")) + " (`python cli.py plugins` lists them)\n")
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("error: name a plugin (KIND NAME) or pass --all")


def test_the_kit_imports_neither_lit_nor_lightning():
    # arch_plugins is the floor of the house: the kit finds the model stacks through entry points instead.
    code = ("import sys, arch_plugins.testing, arch_plugins.testing.distributed, arch_plugins.testing.__main__; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lit', 'lightning', 'pytorch_lightning'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
