"""What every task's LightningModule shares: the optimizer, the constraints, how blocks run, the checkpoint extras.

Subclasses (LanguageModel, ImageClassifier) build ``self.model`` and save ``lr``, ``weight_decay``,
``betas``, ``warmup_steps``, ``min_lr_ratio``, ``optimizer``, ``optimizer_options``, ``schedule`` and
``schedule_options`` as hyperparameters; they own loss and metrics only.
How the blocks execute (``compile``, ``activation_checkpointing``) and what diagnostics record (``diagnostics``)
are passed to this base and are not hyperparameters: a resumed run takes them from its own command line
(LightningCLI restores a checkpoint's hyperparameters over the command line's), so a run can resume under
another overlay, or with diagnostics turned off or made denser around a problem.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_info

from arch_plugins.declarations import has_progress_hooks
from lit import compile_mode, sharded_build
from lit.callbacks import (
    LogRoleTable,
    RenormalizeUnitNormWeights,
    ReportTrainingProgress,
    StopOnNonFiniteLoss,
    has_unit_norm_weights,
)
from lit.checkpoints import restore_rng_states, rng_states
from lit.common_random_numbers import BY_NAME, RuntimeStreams, build
from lit.compile_mode import CompileOption
from lit.compute import non_embedding_parameters
from lit.diagnostics import Diagnostics, DiagnosticsConfig
from lit.errors import UserInputError
from lit.log_steps import is_log_step
from lit.matmul_precision import allow_tf32
from lit.optim import configure, select_optimizer
from lit.parallel import checkpoint_blocks, compile_model, is_sharded, shard, wraps
from lit.schedules import check as check_schedule
from lit.throughput import ThroughputWindow, device_peak, mfu
from lit.tracking import per_example

EXECUTION_OPTIONS = ("compile", "activation_checkpointing", "diagnostics")


class ArchitectureTask(L.LightningModule):
    """Args:
        compile: ``false``, ``true`` (``torch.compile``: the model as one graph, each block on its own under FSDP2),
            ``reduce-overhead`` (the training step as CUDA graphs) or ``auto`` (the default: eager on a CPU; on CUDA
            CUDA graphs for a one-process model under 50M parameters, ``true`` otherwise): ``lit/compile_mode.py``.
        activation_checkpointing: recompute each block's activations in backward.
        items: what training throughput counts (``tokens``, ``images``): logged as ``train/<items>_per_s``.
        diagnostics: what the diagnostics callback records and how often (``lit/diagnostics``).
    """

    # The options that define the weights: with --ckpt_path, a command-line flag may not ask for another value of
    # these than the checkpoint's (lit/command_line_over_checkpoint.py); every other flag wins over the checkpoint.
    ARCHITECTURE_OPTIONS: tuple[str, ...] = ("arch",)

    def __init__(self, compile: CompileOption = compile_mode.AUTO, activation_checkpointing: bool = False,
                 items: str = "samples", diagnostics: DiagnosticsConfig | None = None):
        super().__init__()
        from lit.init_from import allow_checkpoint_types  # deferred: init_from reads the models this module builds

        allow_checkpoint_types()  # a run resumed with --ckpt_path reads its config types weights-only
        self.compile_requested = compile_mode.parse(compile)
        # What the run compiles with, known once the device is (configure_model); until then what was asked,
        # with auto counted as eager (what it is wherever no model is configured: a CPU, a unit test).
        self.compiled = self.compile_requested if self.compile_requested != compile_mode.AUTO else False
        self.recompute_activations = activation_checkpointing
        self.diagnostics = diagnostics if diagnostics is not None else DiagnosticsConfig()
        self.throughput, self.throughput_metric = ThroughputWindow(), f"train/{items}_per_s"
        self.peak_flops: float | None = None  # the device's dense peak for the run's dtype; None: no train/mfu
        self._log_step_loss: torch.Tensor | None = None
        self.flops_metric = f"model/flops_per_{items.removesuffix('s')}"
        self.flops_per_item: float | None = None
        self._size_logged = False

    def training_flops_per_item(self) -> float | None:
        """Training FLOPs per item (token, image) of ``self.model`` as built; None where the task cannot count."""
        return None

    def setup(self, stage: str) -> None:
        # Counted on the model as built, before compile or sharding wrap it (lit/compute.py).
        if stage == "fit" and self.flops_per_item is None:
            self.flops_per_item = self.training_flops_per_item()
        if self._trainer is not None:
            allow_tf32(self.trainer.precision, self.trainer.strategy.root_device)

    def log_training_step(self, loss: torch.Tensor, items: int) -> None:
        """The metrics every task logs per training step: loss, learning rate, items/s over all processes and MFU.

        Once per fit it also logs the run's size facts that comparisons need (``cli.py compare`` turns
        steps into tokens and reports parameters): ``model/parameters``, ``model/non_embedding_parameters``,
        ``train/items_per_step`` and ``model/flops_per_token`` (or ``_per_image``); and at every logged step
        ``train/flops``, the training FLOPs spent so far, so curves can be drawn against compute.

        Nothing here reads the device or copies a host value to it on a step that logs nothing (a GPU would
        wait for either): the loss stays a device tensor, which Lightning reads at log steps only; the host
        scalars (learning rate, FLOPs) are logged at log steps only, as CPU tensors; the loss on the progress
        bar and the throughput are logged at the end of log steps (``on_train_batch_end``).
        """
        per_step = items * self.trainer.world_size * self.trainer.accumulate_grad_batches
        if not self._size_logged:
            self._size_logged = True
            # numel of an FSDP2 DTensor is the global count, so this is the whole model on any strategy.
            facts = {"model/parameters": float(sum(p.numel() for p in self.parameters())),
                     "model/non_embedding_parameters": float(non_embedding_parameters(self.model)),
                     "train/items_per_step": float(per_step)}
            if self.flops_per_item is not None:
                facts[self.flops_metric] = self.flops_per_item
            for logger in self.loggers:
                logger.log_metrics(facts, step=self.global_step)
        # Not on the progress bar: Lightning reads every progress-bar metric at every batch (a sync each).
        self.log("train/loss", loss)
        self.throughput.add(items * self.trainer.world_size)
        if not is_log_step(self.trainer):
            return
        self._log_step_loss = loss.detach()
        if self.flops_per_item is not None:
            # global_step counts the optimizer steps already taken: this batch belongs to the (global_step + 1)th.
            self._log_host("train/flops", self.flops_per_item * per_step * (self.global_step + 1))
        # The task's learning rate as scheduled (a group's own lr is this times its role's multiplier), read here
        # because the scheduler steps before the batch ends.
        group = self.optimizers().param_groups[0]
        self._log_host("train/lr", group["lr"] / group["lr_ratio"] if group.get("lr_ratio") else group["lr"])

    def _log_host(self, name: str, value: float, prog_bar: bool = False, logger: bool = True) -> None:
        # A CPU tensor: self.log(float) would copy the value to the device (a sync on a GPU), and Lightning would
        # read it back at every later batch had it a place on the progress bar.
        self.log(name, torch.tensor(float(value), dtype=torch.float64), prog_bar=prog_bar, logger=logger)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        loss, self._log_step_loss = self._log_step_loss, None
        if loss is None:  # not a log step (set in log_training_step)
            return
        # The log step's one read of the device (Lightning reads the logged metrics next, at no extra wait):
        # everything queued so far has run, so the window's end below is the device's as well as the host's.
        self._log_host("train/loss", loss.float().item(), prog_bar=True, logger=False)
        rate = self.throughput.read()
        if rate is None:
            return
        self._log_host(self.throughput_metric, rate, prog_bar=True)
        if self.flops_per_item is not None and self.peak_flops is not None:
            self._log_host("train/mfu", mfu(self.flops_per_item, rate, self.trainer.world_size, self.peak_flops))

    def on_train_epoch_start(self) -> None:
        self.throughput.start()

    def on_train_epoch_end(self) -> None:
        self.throughput.drop()  # time spent outside training steps is not training throughput

    def on_validation_start(self) -> None:
        self.throughput.drop()

    def on_validation_end(self) -> None:
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self.throughput.start()

    def configure_model(self) -> None:
        # torchtitan's order: activation checkpointing, then compile, then FSDP2 (strategies with a device mesh of
        # more than one process: on one, FSDP2 would cost its hooks and copies and shard nothing).
        wrap_one_device = getattr(self._trainer.strategy, "wrap_one_device", False) if self._trainer else False
        sharding = self.device_mesh is not None and wraps(self.device_mesh, wrap_one_device=wrap_one_device)
        if self.recompute_activations:
            checkpoint_blocks(self.model)
        self._resolve_compile(sharding)
        if self.compiled:
            compile_model(self.model, per_block=sharding,
                          mode=compile_mode.GRAPHS if self.compiled == compile_mode.GRAPHS else None)
        if self.device_mesh is not None and not is_sharded(self.model):
            if not sharding:  # says so in one line (shard), and leaves the model as it is
                shard(self.model, self.device_mesh, wrap_one_device=False)
                return
            whole = sharded_build.whole_state(self.model) if sharded_build.requested() else None
            shard(self.model, self.device_mesh, self.trainer.precision if self._trainer else None,
                  wrap_one_device=wrap_one_device)
            if whole is not None:
                sharded_build.materialize(self.model, self.trainer.strategy.root_device, whole)

    def _resolve_compile(self, sharding: bool) -> None:
        """What ``compile`` runs with here (``lit/compile_mode.py``), said in the run's startup line and logged as the
        param ``model/compile_resolved``, so a run records how it ran."""
        if self._trainer is None:
            return
        strategy = self.trainer.strategy
        resolution = compile_mode.resolve(self.compile_requested, self.model, strategy.root_device,
                                          self.trainer.world_size, self.trainer.accumulate_grad_batches)
        if resolution.mode == compile_mode.GRAPHS and sharding:
            # FSDP2's hooks (all-gathers, reshards) run between the per-block graphs: never captured nor measured here.
            resolution = compile_mode.Resolution(True, f"{resolution.why}; FSDP2 shards the model: no CUDA graphs")
        self.compiled = resolution.mode
        requested = {False: "false", True: "true"}.get(self.compile_requested, self.compile_requested)
        rank_zero_info(f"--model.compile={requested}: {resolution.label} ({resolution.why})")
        if self.trainer.state.fn == "fit":
            for logger in self.loggers:
                logger.log_hyperparams({"model/compile_resolved": resolution.label})

    def configure_callbacks(self) -> list[L.Callback]:
        # Whatever the architecture, weights that declared a unit-norm constraint are kept on the sphere;
        # attached here so that selecting such a plugin on the command line cannot forget the callback.
        # A diverged run stops before it overwrites the last good checkpoint.
        # The role table is logged once per fit (what each parameter is decides its optimizer group and decay).
        callbacks: list[L.Callback] = [StopOnNonFiniteLoss(), LogRoleTable()]
        if has_unit_norm_weights(self.model):
            callbacks.append(RenormalizeUnitNormWeights())
        # Likewise for modules that follow the step count (PRepBN's schedule, BHyT's refresh).
        if has_progress_hooks(self.model):
            callbacks.append(ReportTrainingProgress())
        # On by default, as cheap as its interval makes it; off (interval 0) attaches nothing at all.
        if self.diagnostics.enabled:
            callbacks.append(Diagnostics(self.diagnostics))
        return callbacks

    @staticmethod
    def check_optimizer(optimizer: str, optimizer_options: dict | None, schedule: str,
                        schedule_options: dict | None) -> None:
        """Called by subclasses' ``__init__``: a bad optimizer or schedule fails before anything trains."""
        select_optimizer(optimizer, optimizer_options)
        check_schedule(schedule, schedule_options)

    def training_batches_per_epoch(self) -> int | None:
        """Batches per epoch and process, from the training DataLoader's length (None: no length).

        The DataLoader is built but not iterated. Lightning's ``estimated_stepping_batches`` would, in a run bounded
        by ``max_epochs``, start its iterator here, before a resumed run's loop progress is restored: with
        workers, the first indices are then drawn from the start of epoch 0 and the resumed epoch replays them.
        """
        trainer = self.trainer
        loader = getattr(trainer.datamodule, "train_dataloader", None) if trainer.datamodule is not None else None
        if loader is None:
            return None
        try:
            batches = len(loader())
        except TypeError:
            return None
        limit = trainer.limit_train_batches
        return min(batches, int(limit)) if isinstance(limit, int) else int(batches * limit)

    def stepping_batches(self, batches_per_epoch: int | None) -> int:
        """Optimizer steps of this run (Lightning's ``estimated_stepping_batches``, without starting the loader)."""
        trainer = self.trainer
        if batches_per_epoch is None:
            return int(trainer.estimated_stepping_batches)
        steps = math.ceil(batches_per_epoch / trainer.accumulate_grad_batches) * max(trainer.max_epochs or 1, 1)
        if trainer.max_epochs in (None, -1):
            steps = trainer.max_steps
        elif trainer.max_steps != -1:
            steps = min(steps, trainer.max_steps)
        return int(steps)

    def configure_optimizers(self):
        hp = self.hparams
        self._schedule_total_steps = self.stepping_batches(self.training_batches_per_epoch())
        optimizer, options = hp.get("optimizer", "adamw"), hp.get("optimizer_options")
        if (optimizer == "adamw" and "fused" not in (options or {}) and str(self.trainer.precision) == "16-mixed"
                and (self.trainer.gradient_clip_val or 0) > 0):
            # fp16's gradient scaler cannot unscale before clipping when the fused step unscales by itself
            # (Lightning refuses the pair); the foreach step is the one to clip for.
            options = {**(options or {}), "fused": False}
        return configure(self, optimizer=optimizer, optimizer_options=options,
                         lr=hp.lr, weight_decay=hp.weight_decay, betas=hp.betas, warmup_steps=hp.warmup_steps,
                         min_lr_ratio=hp.min_lr_ratio, schedule=hp.get("schedule", "cosine"),
                         schedule_options=hp.get("schedule_options"), total_steps=self._schedule_total_steps)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        plugin = self.trainer.precision_plugin
        if ((gradient_clip_val or 0) > 0 and isinstance(plugin, MixedPrecision) and plugin.scaler is None
                and getattr(optimizer, "_step_supports_amp_scaling", False)):
            # Lightning refuses to clip for an optimizer that unscales by itself (the fused AdamW) under any
            # autocast, but only fp16 has a scaler: under bf16 the gradients are already true, so clipping them
            # is right, and refusing made every bf16-mixed run on a GPU (fused by default there) with clipping
            # fail at its first step. fp16 keeps the refusal (configure_optimizers picks the foreach step).
            if gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
                plugin.clip_grad_by_value(optimizer, gradient_clip_val)
            else:
                plugin.clip_grad_by_norm(optimizer, gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def build_model(self, factory, random_numbers: str) -> torch.nn.Module:
        """``factory()`` under the run's rule for random numbers (``lit/common_random_numbers.py``): by
        construction order, or keyed by each parameter's name so that variants share what they have in common."""
        self.random_numbers, self.random_numbers_seed = random_numbers, torch.initial_seed()
        self.built_on_meta = sharded_build.builds_on_meta()
        if self.built_on_meta:  # rank 0's weights arrive after sharding (lit/sharded_build.py)
            with torch.device("meta"):
                return factory()
        return build(factory, random_numbers, self.random_numbers_seed)

    def on_train_start(self) -> None:
        self._check_resumed_schedule()
        self.peak_flops = device_peak(self.trainer.strategy.root_device, self.trainer.precision)
        if getattr(self, "random_numbers", None) == BY_NAME and getattr(self, "_streams", None) is None:
            # Hooks inside the compiled model would break its graph: compiled runs key the stream by batch only.
            self._streams = RuntimeStreams(self.model, self.random_numbers_seed, self.global_rank,
                                           per_module=not self.compiled)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if getattr(self, "_streams", None) is not None:
            self._streams.start_batch(self.trainer.fit_loop.total_batch_idx)

    def on_train_end(self) -> None:
        if getattr(self, "_streams", None) is not None:
            self._streams.remove()
            self._streams = None

    def _check_resumed_schedule(self) -> None:
        # A run resumed with another --trainer.max_steps (a cooldown branch) is only the run it claims to be if its
        # schedule agrees with the one the checkpoint trained under at every step already taken. Only WSD promises
        # that; a cosine run resumed for longer stretches its cosine, as it always did (extending a run is no branch).
        if self.hparams.get("schedule", "cosine") != "wsd":
            return
        resumed = getattr(self, "_resumed_schedule_total", None)
        scheduler = self.lr_schedulers() if self.trainer.lr_scheduler_configs else None
        if resumed is None or scheduler is None or resumed == self._schedule_total_steps:
            return
        factor = scheduler.lr_lambdas[0]
        before = dict(factor.keywords, total_steps=resumed)
        for step in range(self.global_step):
            if factor.func(step, **before) != factor(step):
                raise UserInputError(
                    f"this run's schedule over {self._schedule_total_steps} steps differs at step {step} from the "
                    f"checkpoint's over {resumed} steps, which it already trained {self.global_step} steps of: "
                    f"a cooldown branch starts from a checkpoint before the cooldown (schedule wsd; an earlier "
                    f"checkpoint or a larger --trainer.max_steps)")

    def record_test_examples(self, **values: torch.Tensor) -> None:
        """Per-example results of one test batch (a loss per window or image, a correctness per image), logged at
        the end of the test as the run's ``test_examples.npz`` (``lit/tracking/per_example.py``)."""
        self._test_examples.append({k: v.detach().float() for k, v in values.items()})

    def on_test_epoch_start(self) -> None:
        self._test_examples: list[dict[str, torch.Tensor]] = []

    def on_test_epoch_end(self) -> None:
        loaders = self.trainer.test_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        total = len(loader.dataset) if loader is not None and hasattr(loader.dataset, "__len__") else None
        per_example.log(self, per_example.gathered(self, self._test_examples, total))
        self._test_examples = []

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Lightning does not keep random states; dropout, drop-path and batch mixing resume exactly with them.
        checkpoint["rng_states"] = rng_states()
        checkpoint["schedule_total_steps"] = getattr(self, "_schedule_total_steps", None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:
            restore_rng_states(checkpoint["rng_states"])
        self._resumed_schedule_total = checkpoint.get("schedule_total_steps")
