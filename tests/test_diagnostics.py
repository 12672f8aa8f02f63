"""The diagnostics callback logs what it claims: every value against a computation by hand, the same global
norms under FSDP2 as in one process, nothing attached when off, plugins' scalars in MLflow, spikes across resume."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import lightning as L
import mlflow
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from arch_plugins.interfaces import ResidualHistory
from lit.cli import main
from lit.diagnostics import Diagnostics, DiagnosticsConfig
from lit.diagnostics.norms import ParameterGroups
from lit.diagnostics.probe import attention_statistics, probe
from lit.diagnostics.spikes import SpikeDetector
from lit.language_model import LanguageModel
from lit.models import TransformerConfig
from lit.models.transformer import Attention
from lit.parallel import checkpoint_blocks, compile_model
from tests.conftest import REPO, TINY_LM, subprocess_env
from tests.diagnostics_worker import RecordingLogger

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
VOCAB, T, BATCH, PROBE = 23, 12, 4, 3


def tiny_model(norm: str = "rmsnorm", residual: str = "add", **diagnostics) -> LanguageModel:
    torch.manual_seed(0)
    arch = TransformerConfig(d_model=32, n_layers=2, n_heads=2, norm=norm, residual=residual, init_std=0.1)
    return LanguageModel(vocab_size=VOCAB, block_size=T, arch=arch, lr=1e-2, warmup_steps=0,
                         diagnostics=DiagnosticsConfig(**diagnostics))


def batches(n: int = 3) -> DataLoader:
    tokens = torch.randint(0, VOCAB, (n * BATCH, T + 1), generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=BATCH, shuffle=False)


def fit(model: LanguageModel, steps: int, callbacks=()) -> tuple[L.Trainer, RecordingLogger]:
    logger = RecordingLogger()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=logger, callbacks=list(callbacks),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, gradient_clip_val=1e-3)
    trainer.fit(model, batches())
    return trainer, logger


# --- by hand --------------------------------------------------------------------------------------------------------

# The role of each parameter of a block, written out for the models below (the callback derives it from paths).
HAND_ROLES = {"attn.qkv.": "qkv", "attn.out.": "attn_out", "attn.qk.": "norms", "mlp.up.": "mlp_in",
              "mlp.down.": "mlp_out", "mlp.hidden.": "norms", "attn_in.": "norms", "mlp_in.": "norms",
              "attn_merge.": "residual", "mlp_merge.": "residual"}


def hand_role(name_in_block: str) -> str:
    return next(role for prefix, role in HAND_ROLES.items() if name_in_block.startswith(prefix))


def hand_norms(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """{group: norm} over named tensors: global, per block, per block and role."""
    sums: dict[str, float] = {"global": 0.0}
    for name, t in values.items():
        s = float(t.double().square().sum())
        sums["global"] += s
        if name.startswith("model.stack.blocks."):
            index, rest = name.removeprefix("model.stack.blocks.").split(".", 1)
            for group in (f"layer{int(index):02d}", f"layer{int(index):02d}.{hand_role(rest)}"):
                sums[group] = sums.get(group, 0.0) + s
    return {k: math.sqrt(v) for k, v in sums.items()}


@torch.no_grad()
def hand_probe(module: LanguageModel, idx: torch.Tensor) -> dict[str, float]:
    """The stack's forward written out, reading every state from the ResidualHistory, and each attention's
    probabilities from an explicit softmax of its q, k (the whole T x T matrix at once)."""
    gpt, out = module.model, {}
    stack = gpt.stack
    history = ResidualHistory(states=[stack.embedding(gpt.tok(idx))])
    h = history.states[0]
    for block in stack.blocks:
        h = block(h, history, stack.rope)
    final = stack.final(h)
    logits = gpt.logits(gpt.head(final))
    rms = lambda x: float(x.double().square().mean().sqrt())  # noqa: E731
    out["diag/stream_rms/embedding"], out["diag/stream_rms/final"] = rms(history.states[0]), rms(final)
    for i, block in enumerate(stack.blocks):
        for j, sub in enumerate(("attn", "mlp")):
            out[f"diag/stream_rms/layer{i:02d}.{sub}"] = rms(history.states[1 + 2 * i + j])
            out[f"diag/branch_rms/layer{i:02d}.{sub}"] = rms(history.branches[2 * i + j])
        attn = block.attn
        x = block.attn_in(history.states[2 * i])
        B, n, d = x.shape
        q, k, _ = attn.qkv(x).view(B, n, 3, attn.n_heads, d // attn.n_heads).permute(2, 0, 3, 1, 4)
        q, k = stack.rope(q), stack.rope(k)
        if attn.qk is not None:
            q, k = attn.qk(q, k)
        scale = attn.scale if attn.scale is not None else 1 / math.sqrt(d // attn.n_heads)
        scores = (q @ k.transpose(-1, -2)) * scale
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        p = scores.masked_fill(future, -math.inf).softmax(-1)
        logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
        out[f"diag/attn_entropy/layer{i:02d}"] = float(-(p * logp).sum(-1).mean())
        out[f"diag/attn_max_logit/layer{i:02d}"] = float(scores[..., ~future].max())
    out["diag/logits_rms"], out["diag/logits_max"] = rms(logits), float(logits.max())
    out.update(hand_outliers(history, final, len(stack.blocks)))
    out.update(hand_contribution(history, len(stack.blocks)))
    return out


def hand_kurtosis(x: torch.Tensor) -> float:
    """OSP's evaluate_kurtosis.py in float64: E[x^4] / (unbiased variance)^2 - 3 per token, clamped at 0, mean."""
    x = x.double()
    n = x.shape[-1]
    variance = (x - x.mean(-1, keepdim=True)).square().sum(-1) / (n - 1)
    return float((x.pow(4).sum(-1) / n / variance.square() - 3).clamp(min=0).mean())


def hand_max_median(x: torch.Tensor) -> float:
    magnitudes = x.double().abs().flatten().sort().values
    return float(magnitudes[-1] / magnitudes[(len(magnitudes) - 1) // 2])


def hand_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double(), b.double()
    return (a * b).sum(-1) / (a.square().sum(-1).sqrt() * b.square().sum(-1).sqrt())


def hand_outliers(history: ResidualHistory, final: torch.Tensor, n_layers: int) -> dict[str, float]:
    states = {"embedding": history.states[0], "final": final}
    for i in range(n_layers):
        states[f"layer{i:02d}.attn"], states[f"layer{i:02d}.mlp"] = history.states[1 + 2 * i], history.states[2 + 2 * i]
    out = {}
    for name, x in states.items():
        out[f"diag/kurtosis/{name}"], out[f"diag/max_median/{name}"] = hand_kurtosis(x), hand_max_median(x)
    # Hugging Face's hidden states: the embedding, each later block's input, the final norm's output.
    hf_states = [history.states[0], *(history.states[2 * i] for i in range(1, n_layers)), final]
    out["diag/kurtosis/model"] = sum(hand_kurtosis(x) for x in hf_states) / len(hf_states)
    return out


def hand_contribution(history: ResidualHistory, n_layers: int) -> dict[str, float]:
    out = {}
    for k in range(2 * n_layers):  # a plain stream: the stream entering sublayer k is states[k]
        before, after, branch = history.states[k].double(), history.states[k + 1].double(), history.branches[k]
        name = f"layer{k // 2:02d}.{('attn', 'mlp')[k % 2]}"
        out[f"diag/branch_ratio/{name}"] = float((branch.double().norm(dim=-1) / before.norm(dim=-1)).mean())
        out[f"diag/branch_cosine/{name}"] = float(hand_cosine(branch, before).mean())
        out[f"diag/io_cosine/{name}"] = float(hand_cosine(before, after).mean())
    return out


class Witness(L.Callback):
    """Keeps, per optimizer step, the gradients, the weights before and after the update, and the probe by hand."""

    def __init__(self):
        self.grads, self.before, self.after, self.probes = {}, {}, {}, {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        step = trainer.global_step
        named = dict(pl_module.named_parameters())
        self.grads[step] = {n: p.grad.clone() for n, p in named.items() if p.grad is not None}
        self.before[step] = {n: p.detach().clone() for n, p in named.items()}
        inputs = next(iter(batches()))[0][:PROBE]
        self.probes[step] = hand_probe(pl_module, inputs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[trainer.global_step - 1] = {n: p.detach().clone() for n, p in pl_module.named_parameters()}


@pytest.mark.parametrize("norm, residual", [("rmsnorm", "add"), ("hypersphere", "ngpt")])
def test_every_logged_value_equals_a_computation_by_hand(norm, residual):
    witness = Witness()
    model = tiny_model(norm, residual, interval=1, probe_batch_size=PROBE)
    trainer, logger = fit(model, steps=2, callbacks=[witness])
    logged = logger.metrics
    for step in (0, 1):
        expected = dict(witness.probes[step])
        for group, norm_value in hand_norms(witness.grads[step]).items():
            expected[f"diag/grad_norm/{group}"] = norm_value
        weights = hand_norms({n: w for n, w in witness.before[step].items() if n.startswith("model.stack.blocks.")})
        updates = hand_norms({n: witness.after[step][n] - w for n, w in witness.before[step].items()
                              if n.startswith("model.stack.blocks.")})
        for group in weights:
            if group != "global":
                expected[f"diag/weight_norm/{group}"] = weights[group]
                expected[f"diag/update_ratio/{group}"] = updates[group] / weights[group]
        assert updates["global"] > 0  # the step moved the weights
        got = {name: values[step] for name, values in logged.items() if step in values}
        missing = set(expected) - set(got)
        assert not missing, missing
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, rel=2e-5, abs=1e-7), (step, name)
        # Gradient clipping (1e-3) happens after the record: the norm logged is the one the batch produced.
        assert got["diag/grad_norm/global"] > 1e-2
    roles = {name.split(".", 1)[1] for name in logged if name.startswith("diag/grad_norm/layer00.")}
    assert roles == {"qkv", "attn_out", "mlp_in", "mlp_out", "norms"} | ({"residual"} if residual == "ngpt" else set())
    # The end of training is probed too, with the final weights.
    assert set(logged["diag/stream_rms/final"]) == {0, 1, 2}


def test_the_scalars_are_the_effective_values():
    _, logger = fit(tiny_model("hypersphere", "ngpt", interval=1), steps=1)
    model_after = logger.metrics
    fresh = tiny_model("hypersphere", "ngpt").model
    alpha = fresh.stack.blocks[0].attn_merge.alpha
    # The scale trick stores 1/sqrt(d) and uses 0.05 at init: the effective value is logged, not the stored one.
    assert float(alpha.stored.detach().mean()) == pytest.approx(1 / math.sqrt(32))
    assert model_after["diag/scalar/stack.blocks.0.attn_merge.alpha"][0] == pytest.approx(0.05)
    assert model_after["diag/scalar/logits.s_z"][0] == pytest.approx(1.0)
    assert model_after["diag/scalar/stack.blocks.1.mlp.hidden.s_uv"][0] == pytest.approx(1.0)  # without sqrt(d)
    assert model_after["diag/scalar/stack.blocks.0.attn_merge.alpha"][1] != pytest.approx(0.05, abs=1e-7)


def test_chunked_attention_statistics_equal_one_softmax(monkeypatch):
    q, k = torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 4)
    whole = attention_statistics(q, k, 0.7, True)
    monkeypatch.setattr("lit.diagnostics.probe.CHUNK_ELEMENTS", 2 * 3 * 10 * 3)  # 3 queries per chunk
    chunked = attention_statistics(q, k, 0.7, True)
    torch.testing.assert_close(torch.stack(chunked), torch.stack(whole))
    p = ((q @ k.transpose(-1, -2)) * 0.7).softmax(-1)  # bidirectional: no mask
    entropy, max_logit = attention_statistics(q, k, 0.7, False)
    assert float(entropy) == pytest.approx(float(-(p * p.log()).sum(-1).mean()), rel=1e-5)
    assert float(max_logit) == pytest.approx(float((q @ k.transpose(-1, -2)).max() * 0.7), rel=1e-6)


def test_roles_come_from_the_block_paths():
    roles = lambda model: {g.split(".", 1)[1] for g in ParameterGroups(model).groups if g.startswith("layer00.")}  # noqa: E731
    assert roles(tiny_model()) == {"qkv", "attn_out", "mlp_in", "mlp_out", "norms"}
    torch.manual_seed(0)
    arch = TransformerConfig(d_model=32, n_layers=2, n_heads=2, residual="laurel_rw_lr", projection="pattention")
    assert roles(LanguageModel(vocab_size=VOCAB, block_size=T, arch=arch)) == {"qkv", "attn_out", "ffn", "norms",
                                                                              "residual"}


# --- compile and activation checkpointing -----------------------------------------------------------------------

def test_the_probe_runs_eagerly_under_compile_and_activation_checkpointing():
    model = tiny_model()
    idx = next(iter(batches()))[0][:PROBE]
    reference = probe(model, idx, stream=True, attention=True)
    checkpoint_blocks(model.model)
    compile_model(model.model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of compiles run before this test
    model.train()
    with torch.enable_grad():
        wrapped = probe(model, idx, stream=True, attention=True)
    # embedding, 2 states and 2 branches per block, final; entropy and max logit per block; logits rms, max
    assert set(wrapped) == set(reference) and len(reference) == (1 + 2 * 4 + 1) + 2 * 2 + 2
    for name, value in reference.items():
        torch.testing.assert_close(wrapped[name], value, msg=name)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # nothing was compiled for the probe
    assert model.training and all(m.training for m in model.modules())  # train mode given back


# --- distributed ------------------------------------------------------------------------------------------------

def run_worker(strategy: str, tmp_path) -> dict:
    out = tmp_path / f"{strategy}.pt"
    if strategy == "single":  # in this process: a separate one would only import Lightning again (~10 s of CPU)
        from tests import diagnostics_worker

        diagnostics_worker.main(["--strategy", "single", "--out", str(out)])
        return torch.load(out, weights_only=False)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "diagnostics_worker.py"), "--strategy", strategy,
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


# Two processes reduce the gradients in another order than one, and another CPU's kernels sum in another order again:
# each gradient differs in its last bits (fp32 eps 1.2e-7, relative), a norm over n elements by up to ~sqrt(n) eps,
# and two Adam steps carry that into the weights, updates and ratios logged at step 2 (an update is a difference of
# weights, so its relative error is the weights' times weight/update ~ 100). Seen: 1.1e-5 on an AMD EPYC. 1e-4
# (~800 eps) holds that with room and is still 3,000x below the ~30% a per-shard norm (two halves) would be off.
CROSS_PROCESS_REL = 1e-4


def test_fsdp2_on_two_processes_logs_the_single_process_values(tmp_path):
    # nGPT: every weight sharded unevenly (vocabulary 17), vector scalars gathered from shards, q/k norm and scale.
    single, sharded = run_worker("single", tmp_path), run_worker("fsdp2", tmp_path)
    assert sharded["world_size"] == 2
    assert set(sharded["metrics"]) == set(single["metrics"])
    assert len(single["metrics"]) > 60 and set(single["metrics"]["diag/grad_norm/global"]) == {0, 1, 2}
    for name, values in single["metrics"].items():
        assert set(sharded["metrics"][name]) == set(values), name
        for step, value in values.items():
            assert sharded["metrics"][name][step] == pytest.approx(value, rel=CROSS_PROCESS_REL), (name, step)


# --- off means off ----------------------------------------------------------------------------------------------

def hooks(model: torch.nn.Module) -> list[str]:
    found = [f"{name}.{kind}" for name, m in model.named_modules()
             for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(m, kind)]
    found += [f"{name}.inspect" for name, m in model.named_modules() if isinstance(m, Attention) and m.inspect]
    from torch.nn.modules import module as nn_module

    found += [kind for kind in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks")
              if getattr(nn_module, kind)]
    return found


class HookCheck(L.Callback):
    def __init__(self):
        self.found = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.found += hooks(pl_module)


def test_interval_zero_attaches_no_callback_and_no_hook():
    check = HookCheck()
    trainer, logger = fit(tiny_model(interval=0), steps=2, callbacks=[check])
    assert not any(isinstance(c, Diagnostics) for c in trainer.callbacks)
    assert check.found == [] and hooks(trainer.lightning_module) == []
    assert not any(name.startswith("diag/") for name in logger.metrics)


def test_on_by_default_and_nothing_left_attached_between_probes():
    assert tiny_model().diagnostics.interval == 100
    check = HookCheck()
    trainer, logger = fit(tiny_model(interval=1), steps=2, callbacks=[check])
    assert any(isinstance(c, Diagnostics) for c in trainer.callbacks)
    assert "diag/stream_rms/final" in logger.metrics  # it probed (with hooks) on both steps
    assert check.found == []


# --- through the CLI into MLflow ---------------------------------------------------------------------------------

def mlflow_run(workdir):
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    return client, runs[0]


def test_a_plugins_declared_scalar_reaches_mlflow_under_its_name(workdir):
    main(["fit", "--config", BASELINE, *TINY_LM, "--model.arch.norm=dyt", "--trainer.max_steps=3",
          "--trainer.limit_val_batches=0", "--model.diagnostics.interval=2"])
    client, run = mlflow_run(workdir)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id,
                                                                  "diag/scalar/stack.blocks.0.attn_in.alpha")}
    assert set(history) == {0, 2, 3}  # every 2 steps and at the end
    assert history[0] == pytest.approx(1.0)  # DyT's initial alpha before attention in a narrow LM (Table 11)
    final = torch.load(next(workdir.glob("runs/*/*/checkpoints/last.ckpt")), weights_only=True)["state_dict"]
    assert history[3] == pytest.approx(float(final["model.stack.blocks.0.attn_in.alpha"]))
    assert history[3] != pytest.approx(0.8, abs=1e-6)
    assert {"diag/scalar/stack.embedding.scale", "diag/scalar/stack.final.alpha",
            "diag/grad_norm/layer01.norms", "diag/stream_rms/layer01.mlp"} <= set(run.data.metrics)
    # Not a hyperparameter: a resumed run takes diagnostics from its own command line.
    assert "diagnostics" not in final.get("hyper_parameters", {})


def test_interval_zero_from_the_command_line_logs_no_diagnostics(workdir):
    main(["fit", "--config", BASELINE, *TINY_LM, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
          "--trainer.log_every_n_steps=1", "--model.diagnostics.interval=0"])
    _, run = mlflow_run(workdir)
    assert "train/loss" in run.data.metrics
    assert not [name for name in run.data.metrics if name.startswith("diag/")]


# --- spikes -----------------------------------------------------------------------------------------------------

def test_spike_scores_by_hand():
    detector = SpikeDetector(window=128, threshold=6.0, warmup=20)
    values = [1.0 + 0.01 * (i % 5) for i in range(19)]
    assert [detector.update(loss=v) for v in values] == [0.0] * 19
    assert detector.update(loss=50.0) == 0.0  # only 19 values in the window: still warming up
    detector = SpikeDetector(window=4, threshold=6.0, warmup=3)
    for v in (1.0, 2.0, 3.0):
        assert detector.update(loss=v, grad_norm=1.0) == 0.0  # the grad norm has no spread: it never scores
    assert detector.update(loss=100.0, grad_norm=1.0) == pytest.approx((100.0 - 2.0) / math.sqrt(2 / 3))
    assert detector.count == 1
    window = [2.0, 3.0, 100.0, 4.0]  # the last 4, the spike included
    assert detector.update(loss=4.0) == 0.0  # below the mean: no score (one-sided)
    mean = sum(window) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in window) / 4)
    assert detector.update(loss=500.0) == pytest.approx((500.0 - mean) / std)
    assert detector.count == 2 and list(detector.history["loss"]) == [3.0, 100.0, 4.0, 500.0]
    assert detector.update(loss=-1e9) == 0.0 and detector.count == 2


def fault(step: int) -> str:
    return f"--trainer.callbacks=[{{class_path: tests.fault_injection.LossSpikeAtStep, init_args: {{step: {step}}}}}]"


def test_an_injected_loss_spike_is_counted_warned_and_survives_resume(workdir, caplog):
    common = ["fit", "--config", BASELINE, *TINY_LM, "--trainer.limit_val_batches=0",
              "--trainer.val_check_interval=null", "--model.diagnostics.interval=5", "--model.warmup_steps=0"]
    with caplog.at_level(logging.WARNING, logger="lit.diagnostics.callback"):
        main([*common, "--trainer.max_steps=30", fault(25)])
    warnings = [r.getMessage() for r in caplog.records if "loss spike" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("loss spike at step 25"), warnings
    last = next(workdir.glob("runs/*/*/checkpoints/last.ckpt"))
    state = torch.load(last, weights_only=True)["callbacks"]["Diagnostics"]
    assert state["spikes"]["count"] == 1 and len(state["spikes"]["history"]["loss"]) == 30

    main([*common, "--trainer.max_steps=34", f"--ckpt_path={last}"])
    client, run = mlflow_run(workdir)  # the resumed training continued the same MLflow run
    count = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "diag/spike_count")}
    score = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "diag/spike_score")}
    assert count[25] == 1 and score[25] > 6  # logged on the spike itself, between records
    assert max(v for s, v in score.items() if s != 25) < 6
    assert count[34] == 1  # the count survived the resume
    final = torch.load(next(workdir.glob("runs/*/*/checkpoints/last.ckpt")), weights_only=True)
    assert final["global_step"] == 34
    resumed = final["callbacks"]["Diagnostics"]["spikes"]
    assert resumed["count"] == 1 and len(resumed["history"]["loss"]) == 34  # the window went on, not anew
    assert torch.equal(final["callbacks"]["Diagnostics"]["probe_inputs"], state["probe_inputs"])
