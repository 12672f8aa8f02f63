"""Common random numbers by name (lit/common_random_numbers.py): what two variants share starts identical, and
their dropout masks agree where the shapes agree; the construction-order rule stays available by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lit.common_random_numbers import BY_NAME, CONSTRUCTION_ORDER, RuntimeStreams, build
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig

SEED = 1337


def gpt(**arch):
    config = TransformerConfig(**{"d_model": 32, "n_layers": 2, "n_heads": 2, **arch})
    return lambda: GPT(50, 16, config)


def built(factory, rule: str, seed: int = SEED) -> nn.Module:
    torch.manual_seed(seed)
    return build(factory, rule)


def shared(a: nn.Module, b: nn.Module) -> tuple[list[str], list[str]]:
    """The parameters and buffers both models have (same name, same shape), and those of them that differ."""
    pa = {**dict(a.named_parameters()), **dict(a.named_buffers())}
    pb = {**dict(b.named_parameters()), **dict(b.named_buffers())}
    names = sorted(n for n in set(pa) & set(pb) if pa[n].shape == pb[n].shape)
    return names, [n for n in names if not torch.equal(pa[n], pb[n])]


@pytest.mark.parametrize("residual", ["hyperconn", "laurel_lr", "attnres"])
def test_adding_a_residual_module_leaves_every_other_parameter_bit_identical(residual):
    base = built(gpt(), BY_NAME)
    variant = built(gpt(residual=residual), BY_NAME)
    names, differ = shared(base, variant)
    added = {n for n, _ in variant.named_parameters()} - {n for n, _ in base.named_parameters()}
    assert added, f"{residual} adds no parameter: the test would prove nothing"
    assert len(names) > 10 and differ == []


def test_under_construction_order_the_added_module_shifts_the_others():
    # The rule sweeps used before: the reason pairing bought nothing. It stays available by name.
    names, differ = shared(built(gpt(), CONSTRUCTION_ORDER), built(gpt(residual="laurel_lr"), CONSTRUCTION_ORDER))
    assert differ, "construction order no longer shifts the stream: this file's main test proves nothing"


def test_a_norm_swap_keeps_every_shared_matrix():
    names, differ = shared(built(gpt(), BY_NAME), built(gpt(norm="layernorm"), BY_NAME))
    assert names and differ == []


def test_keyed_init_draws_the_same_distribution_and_depends_on_the_seed():
    keyed, plain = built(gpt(), BY_NAME), built(gpt(), CONSTRUCTION_ORDER)
    for (name, p), (_, q) in zip(keyed.named_parameters(), plain.named_parameters(), strict=True):
        if p.numel() >= 500:  # the same operators at the same scale, other numbers
            assert p.std().item() == pytest.approx(q.std().item(), rel=0.15), name
            assert not torch.equal(p, q), name
    again, other = built(gpt(), BY_NAME), built(gpt(), BY_NAME, seed=SEED + 1)
    assert shared(keyed, again)[1] == []
    assert len(shared(keyed, other)[1]) > 5


class Scratch(nn.Module):
    """Ordinary PyTorch init patterns: a random temporary scaled into a parameter, and an orthogonal init (QR of a
    scratch draw), each behind an optional extra module built first."""

    def __init__(self, extra: bool):
        super().__init__()
        if extra:
            self.extra = nn.Linear(8, 8)
        self.scaled = nn.Parameter(torch.randn(4, 4) * 0.1)
        self.rotation = nn.Linear(6, 6, bias=False)
        nn.init.orthogonal_(self.rotation.weight)


def test_values_are_keyed_by_the_parameter_they_end_in_even_through_temporaries():
    plain, extra = built(lambda: Scratch(False), BY_NAME), built(lambda: Scratch(True), BY_NAME)
    assert torch.equal(plain.scaled, extra.scaled)
    assert torch.equal(plain.rotation.weight, extra.rotation.weight)
    eye = plain.rotation.weight @ plain.rotation.weight.T
    assert torch.allclose(eye, torch.eye(6), atol=1e-5)  # still orthogonal: the operator ran as written


def test_a_build_that_depends_on_more_than_its_config_is_refused():
    calls = []

    def unstable():
        calls.append(1)
        return nn.Linear(4, 4) if len(calls) == 1 else nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    with pytest.raises(RuntimeError, match="construction_order"):
        built(unstable, BY_NAME)


def test_what_draws_after_the_build_does_not_depend_on_the_model():
    built(gpt(), BY_NAME)
    after_base = torch.rand(3)
    built(gpt(residual="laurel_lr"), BY_NAME)
    assert torch.equal(after_base, torch.rand(3))


def dropout_masks(model: nn.Module, rule: str, steps: int = 2) -> dict[tuple[str, int], torch.Tensor]:
    """The mask of every nn.Dropout over a few training batches, by (module path, batch)."""
    masks, batch = {}, [0]

    def record(path):
        def hook(module, args, out):
            masks[(path, batch[0])] = (out == 0) & (args[0] != 0)
        return hook

    for path, m in model.named_modules():
        if isinstance(m, nn.Dropout):
            m.register_forward_hook(record(path))
    streams = RuntimeStreams(model, SEED) if rule == BY_NAME else None
    model.train()
    data = torch.Generator().manual_seed(0)
    for b in range(steps):
        batch[0] = b
        if streams is not None:
            streams.start_batch(b)
        model(torch.randint(0, 50, (2, 16), generator=data)).sum().backward()
    return masks


def test_the_per_module_hook_asks_no_device_question(monkeypatch):
    # Under Lightning every torch.cuda.is_available() loads NVML: asked per module call, it cost more than a
    # micro-size step (benchmarks/init_by_name.py). The streams ask once, when they are installed.
    model = built(gpt(dropout=0.2), BY_NAME)
    streams = RuntimeStreams(model, SEED)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    streams.start_batch(0)
    model.train()
    model(torch.zeros(2, 16, dtype=torch.long))
    assert asked == []


@pytest.mark.parametrize("rule", [BY_NAME, CONSTRUCTION_ORDER])
def test_dropout_masks_agree_across_variants_by_module_and_batch(rule):
    base = dropout_masks(built(gpt(dropout=0.2), rule), rule)
    variant = dropout_masks(built(gpt(dropout=0.2, residual="laurel_lr"), rule), rule)
    assert base and set(base) == set(variant)
    agree = all(torch.equal(base[k], variant[k]) for k in base)
    assert agree == (rule == BY_NAME)  # construction order: the added module shifts every later mask


def test_sweeps_record_the_rule_and_pass_it_to_every_run(tmp_path):
    from lit.sweep.child import fit_args
    from lit.sweep.command import build_protocol, parser
    from lit.sweep.grid import Child

    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "gpt_baseline.yaml")
    for given, expected in (([], BY_NAME), (["--random_numbers", CONSTRUCTION_ORDER], None)):
        a, fit = parser().parse_known_args(["--config", recipe, "--vary", "model.arch.norm=rmsnorm,layernorm",
                                            *given])
        proto, variants, _ = build_protocol(a, fit)
        assert proto.get("random_numbers") == expected  # absent: the old rule, so old sweeps keep their ids
        manifest = {"protocol": {**proto, "sweep_id": "x"}, "recipe": recipe, "fit_args": fit, "experiment": "e",
                    "tracking_uri": "sqlite:///m.db", "save_dir": str(tmp_path), "parent_run_id": "p"}
        args = fit_args(manifest, Child("k", variants[1].label, "seed", 7, 0, variants[1].overrides), None)
        assert ("--model.random_numbers=by_name" in args) == (expected == BY_NAME)
    json.dumps(proto)  # the protocol stays plain JSON


@pytest.mark.parametrize("task", ["text", "images"])
def test_the_tasks_build_their_model_by_the_rule_they_are_given(task):
    from lit.image_classifier import ImageClassifier
    from lit.language_model import LanguageModel

    def make(rule: str, **arch):
        torch.manual_seed(SEED)  # what seed_everything does before LightningCLI builds the model
        config = TransformerConfig(d_model=32, n_layers=2, n_heads=2, **arch)
        if task == "text":
            return LanguageModel(vocab_size=50, block_size=16, arch=config, random_numbers=rule)
        return ImageClassifier(num_classes=10, image_size=8, in_chans=1, patch_size=4, arch=config,
                               random_numbers=rule)

    for rule in (BY_NAME, CONSTRUCTION_ORDER):
        base, variant = make(rule), make(rule, residual="laurel_lr")
        assert base.hparams.random_numbers == rule  # saved with the run's hyperparameters
        assert (shared(base.model, variant.model)[1] == []) == (rule == BY_NAME)


class StreamsBefore:
    """``RuntimeStreams`` as it was before attention drew from its own stream (commit 41e91a9), CPU part: a pre-hook
    on every module reseeds, nothing hands the caller's stream back. The reference for what must not change."""

    def __init__(self, model: nn.Module, seed: int):
        from lit.common_random_numbers import keyed_seed

        self.seed, self.batch_key, self.keyed = seed, 0, keyed_seed
        for path, module in model.named_modules():
            module.register_forward_pre_hook(self._hook(keyed_seed(path or "(model)")))

    def _hook(self, path_key: int):
        def reseed(module, args):
            if module.training:
                torch.default_generator.manual_seed(self.batch_key ^ path_key)
        return reseed

    def start_batch(self, batch: int) -> None:
        self.batch_key = self.keyed(self.seed, 0, batch)
        torch.default_generator.manual_seed(self.batch_key ^ self.keyed("(batch)"))


def attention_masks(monkeypatch, model: nn.Module, streams, steps: int = 2) -> dict[tuple[int, int], torch.Tensor]:
    """The attention-dropout mask of every layer over a few training batches, by (layer, batch): the mask the
    generator gives at the moment attention draws it, read without consuming it (SDPA's mask; checked below)."""
    masks, where = {}, {"batch": 0}
    sdpa, dropout = torch.nn.functional.scaled_dot_product_attention, torch.nn.functional.dropout

    def record(shape, p):
        with torch.random.fork_rng(devices=[]):
            mask = dropout(torch.ones(shape), p) != 0
        layer = sum(1 for b, _ in masks if b == where["batch"])
        masks[(where["batch"], layer)] = mask

    def recording_sdpa(q, k, v, *args, dropout_p=0.0, **kwargs):
        if dropout_p > 0:
            record((*q.shape[:-1], k.shape[-2]), dropout_p)
        return sdpa(q, k, v, *args, dropout_p=dropout_p, **kwargs)

    def recording_dropout(x, p=0.5, *args, **kwargs):  # the explicit-attention path drops its 4-d weights
        if x.dim() == 4 and p > 0:
            record(x.shape, p)
        return dropout(x, p, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    monkeypatch.setattr(torch.nn.functional, "dropout", recording_dropout)
    model.train()
    data = torch.Generator().manual_seed(0)
    for b in range(steps):
        where["batch"] = b
        streams.start_batch(b)
        model(torch.randint(0, 50, (2, 16), generator=data)).sum().backward()
    monkeypatch.undo()
    return masks


def test_the_recorded_mask_is_the_one_attention_applies():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    with torch.random.fork_rng(devices=[]):
        mask = torch.nn.functional.dropout(torch.ones(2, 2, 16, 16), 0.3) != 0
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.3)  # the same state
    scores = (q @ k.transpose(-1, -2) * 8 ** -0.5).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1),
                                                                float("-inf"))
    assert torch.allclose(y, (scores.softmax(-1) * mask / 0.7) @ v, atol=1e-5)


def test_each_layer_draws_its_attention_dropout_from_its_own_stream(monkeypatch):
    # Before: attention drew after calling the shared `rope` module, whose hook had reseeded last: every layer drew
    # `stack.rope`'s numbers, the same mask in each.
    model = built(gpt(dropout=0.2, n_layers=3), BY_NAME)
    masks = attention_masks(monkeypatch, model, RuntimeStreams(model, SEED))
    assert len(masks) == 6
    for batch in (0, 1):
        layers = [masks[(batch, layer)] for layer in range(3)]
        assert not torch.equal(layers[0], layers[1]) and not torch.equal(layers[1], layers[2])
    assert not torch.equal(masks[(0, 0)], masks[(1, 0)])  # and a new mask each batch


@pytest.mark.parametrize("variant", [dict(residual="laurel_lr"), dict(qk_norm="rmsnorm"),
                                     dict(clipped_softmax_gamma=-0.05)], ids=["laurel_lr", "qk_norm", "explicit"])
def test_attention_dropout_masks_agree_across_variants_by_layer_and_batch(monkeypatch, variant):
    # A module added before attention (LAUREL), a child attention calls before it draws (QK-norm), attention's own
    # explicit softmax path (clipped softmax): the layer's mask is the baseline's all the same. Before, the
    # explicit path drew from its `probs` child's stream and the SDPA path from `rope`'s.
    masks = {}
    for name, arch in (("base", {}), ("variant", variant)):
        model = built(gpt(dropout=0.2, **arch), BY_NAME)
        masks[name] = attention_masks(monkeypatch, model, RuntimeStreams(model, SEED))
    assert len(masks["base"]) == 4 and masks["base"].keys() == masks["variant"].keys()
    assert all(torch.equal(masks["base"][k], masks["variant"][k]) for k in masks["base"])


def train(model: nn.Module, streams, steps: int = 3) -> list[torch.Tensor]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data, losses = torch.Generator().manual_seed(0), []
    model.train()
    for b in range(steps):
        streams.start_batch(b)
        x = torch.randint(0, 50, (2, 16), generator=data)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [*losses, *model.parameters()]


@pytest.mark.parametrize("arch", [dict(drop_path=0.3), dict(drop_path=0.3, residual="laurel_lr", qk_norm="rmsnorm")],
                         ids=["drop_path", "drop_path_laurel_qk_norm"])
def test_without_attention_dropout_training_is_bit_identical_to_the_streams_before(arch):
    # Every recipe trains with dropout 0: the change to where attention draws must change none of their numbers.
    # Stochastic depth (drawn by a leaf module, DropPath, at its own entry) is on, so the streams are really used.
    got = []
    for streams_class in (StreamsBefore, RuntimeStreams):
        model = built(gpt(**arch), BY_NAME)
        got.append(train(model, streams_class(model, SEED)))
    assert all(torch.equal(a, b) for a, b in zip(*got, strict=True))
    assert not torch.equal(got[0][0], got[0][1])  # the losses moved: a run, not a constant


def test_a_forward_hands_the_global_stream_back_where_it_was():
    # What changed for a run without dropout, by design: after the forward the global generator is where the batch
    # left it (before, it was left seeded by the last module entered). A fit draws nothing there (batch mixing
    # draws before the forward): a by-name fit's losses and weights were checked bit-identical before and after.
    model = built(gpt(drop_path=0.3), BY_NAME)
    streams = RuntimeStreams(model, SEED)
    model.train()
    streams.start_batch(0)
    expected = torch.random.get_rng_state()
    model(torch.zeros(2, 16, dtype=torch.long)).sum().backward()
    assert torch.equal(torch.random.get_rng_state(), expected) and streams._callers == []


def test_recomputation_under_activation_checkpointing_draws_the_same_masks():
    # Checkpointed blocks rerun their forward in backward, hooks included: every mask (attention, residual dropout,
    # drop-path) must come out the same, so the gradients equal those of the run that kept its activations.
    from lit.parallel import checkpoint_blocks

    grads = []
    for recompute in (False, True):
        model = built(gpt(dropout=0.2, drop_path=0.2), BY_NAME)
        if recompute:
            checkpoint_blocks(model)
        streams = RuntimeStreams(model, SEED)
        model.train()
        streams.start_batch(0)
        model(torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
        assert streams._callers == []
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
