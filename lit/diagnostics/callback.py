"""The diagnostics callback: what normalisation research looks at, every ``interval`` steps, into MLflow.

Attached by ``ArchitectureTask.configure_callbacks`` when ``--model.diagnostics.interval`` > 0; like the
block, it names no plugin. On step ``s`` with ``s % interval == 0`` (and once more when training ends) it
logs, at MLflow step ``s`` (the step ``train/loss`` of that batch is logged at):

- ``stream``, ``attention``, ``outliers``, ``contribution``: a probe forward before the step's update
  (``lit/diagnostics/probe.py``);
- ``scalars``: every learned scalar that a module declared (``arch_plugins.diagnostics``);
- ``grads``: gradient norms of step ``s`` before clipping (``on_before_optimizer_step``: after AMP unscaling,
  before Lightning's gradient clipping), the weight norms before the update, and ||W_after - W_before|| /
  ||W_before|| of the update itself, per block and per role (``lit/diagnostics/norms.py``). Only on these
  steps is a copy of the weights taken (this rank's shard of them under FSDP2), and freed after the step.
- ``spikes``: the training loss (mean over the step's micro-batches) and the global gradient norm of every step
  enter a ``SpikeDetector``; the score is logged at the interval (the highest since the last record, so a
  spike between records still shows) and at every spike (at the spike's step), with the count and a warning line.
  Both stay on the device, one pair per step, and enter the detector together, in step order, at the next log
  step (``lit/log_steps.py``), diagnostics step, checkpoint or the end of training: one read per log interval, none
  on the steps in between (a per-step read was a host-device sync per step on a GPU).

Only global rank 0 logs. Where the model is sharded (DTensor parameters: FSDP2) every rank computes with it,
because the probe's forward and the norms' all-reduce are collectives; otherwise (one process, DDP) the
other ranks do nothing. The spike window and count and the probe batch are saved in checkpoints.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch

from arch_plugins.constraints import is_dtensor
from lit.diagnostics.config import DiagnosticsConfig
from lit.diagnostics.norms import GLOBAL, ParameterGroups
from lit.diagnostics.probe import probe
from lit.diagnostics.scalars import scalar_values
from lit.diagnostics.spikes import SpikeDetector
from lit.log_steps import is_log_step
from lit.tracking.names import SPIKE_COUNT

log = logging.getLogger(__name__)
PROBED = {"stream", "attention", "outliers", "contribution"}  # the groups a probe forward measures


class Diagnostics(L.Callback):
    """Records ``diag/*`` metrics every ``config.interval`` optimizer steps (see the module docstring)."""

    def __init__(self, config: DiagnosticsConfig | None = None):
        self.config = config if config is not None else DiagnosticsConfig()
        if not self.config.enabled:
            raise ValueError("diagnostics are off (interval 0 or nothing to record): do not attach the callback")
        self.record = set(self.config.record)
        self.spikes = SpikeDetector()
        self.probe_inputs: torch.Tensor | None = None
        self._groups: ParameterGroups | None = None
        self._works = True  # this rank takes part in the computations
        self._step = -1  # the optimizer step whose batches are running
        self._probed_step: int | None = None
        self._loss: torch.Tensor | None = None  # sum over the step's micro-batches of loss / accumulation
        self._grad_squares: torch.Tensor | None = None
        self._weight_squares: torch.Tensor | None = None
        self._snapshot: list[torch.Tensor] | None = None
        self._max_score = 0.0  # highest spike score since the last record
        self._pending: list[tuple[int, torch.Tensor | None, torch.Tensor | None]] = []  # (step, loss, grad norm)
        self._trainer: L.Trainer | None = None

    def due(self, step: int) -> bool:
        return step % self.config.interval == 0

    # --- hooks -----------------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sharded = any(is_dtensor(p) for p in pl_module.parameters())
        self._works = trainer.is_global_zero or sharded
        self._groups = ParameterGroups(pl_module) if self.record & {"grads", "spikes"} else None
        self._step, self._probed_step, self._loss = -1, None, None
        self._pending, self._trainer = [], trainer

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step = trainer.global_step
        if self.probe_inputs is None:
            inputs = batch[0] if isinstance(batch, (list, tuple)) else batch  # both tasks: (inputs, targets)
            self.probe_inputs = inputs[:self.config.probe_batch_size].detach().clone()
        if self.due(self._step) and self._probed_step != self._step:  # once per step, not per micro-batch
            self._record_state(trainer, pl_module, self._step)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        groups = self._groups
        if groups is None or not self._works:
            return
        record_grads = "grads" in self.record and self.due(self._step)
        if not (record_grads or "spikes" in self.record):
            return
        squares = groups.squares([p.grad for p in groups.params])
        if record_grads:
            self._grad_squares = squares
            self._snapshot = [t.clone() for t in groups.local(groups.params)]
            self._weight_squares = groups.squares(self._snapshot)
        else:  # spikes only need the global norm: one small all-reduce when sharded
            self._grad_squares = groups.reduce(squares)[0]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss = loss.detach().float() + (self._loss if self._loss is not None else 0)
        if trainer.global_step == self._step:
            return  # accumulating gradients: the optimizer has not stepped yet
        step, metrics, grad_norm = self._step, {}, None
        if self._snapshot is not None:
            metrics, grad_norm = self._norms()
        elif self._grad_squares is not None:
            grad_norm = self._grad_squares.sum().sqrt()
        if "spikes" in self.record and self._works:
            self._pending.append((step, self._loss, grad_norm))
            if self.due(step) or is_log_step(trainer):
                metrics.update(self._enter_spikes(trainer))
        self._loss = self._grad_squares = None
        self._log(trainer, metrics, step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The weights training ends with, so that the first and the last records compare start and end.
        step = trainer.global_step
        if self._probed_step != step and self.probe_inputs is not None:
            self._record_state(trainer, pl_module, step)
        if "spikes" in self.record:
            self._flush_spikes(trainer)
            self._log(trainer, {SPIKE_COUNT: self.spikes.count}, step)

    def _flush_spikes(self, trainer: L.Trainer | None) -> None:
        if self._pending and trainer is not None:
            last = self._pending[-1][0]
            self._log(trainer, self._enter_spikes(trainer), last)

    def state_dict(self) -> dict[str, Any]:
        self._flush_spikes(self._trainer)  # a checkpoint holds the detector as of its step
        inputs = self.probe_inputs.cpu() if self.probe_inputs is not None else None
        return {"spikes": self.spikes.state_dict(), "probe_inputs": inputs, "max_score": self._max_score}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.spikes.load_state_dict(state_dict.get("spikes", {}))
        self.probe_inputs = state_dict.get("probe_inputs")
        self._max_score = float(state_dict.get("max_score", 0.0))

    # --- what is recorded ------------------------------------------------------------------------------------------

    def _record_state(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        """The probe forward and the declared scalars, for the weights after ``step`` updates."""
        self._probed_step = step
        if not self._works:
            return
        metrics: dict[str, torch.Tensor] = {}
        if self.record & PROBED:
            inputs = self.probe_inputs.to(pl_module.device)
            metrics.update(probe(pl_module, inputs, stream="stream" in self.record,
                                 attention="attention" in self.record, outliers="outliers" in self.record,
                                 contribution="contribution" in self.record,
                                 precision_context=trainer.precision_plugin.forward_context))
        if "scalars" in self.record:
            metrics.update(scalar_values(getattr(pl_module, "model", pl_module)))
        self._log(trainer, metrics, step)

    def _norms(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        groups = self._groups
        after = groups.local(groups.params)
        for before, now in zip(self._snapshot, after, strict=True):
            before.sub_(now)  # in place: the copy becomes W_before - W_after
        updates = groups.squares(self._snapshot)
        self._snapshot = None
        grads, weights, updates = groups.reduce(self._grad_squares, self._weight_squares, updates)
        grads, weights, updates = groups.group_norms(grads), groups.group_norms(weights), groups.group_norms(updates)
        metrics = {f"diag/grad_norm/{name}": norm for name, norm in grads.items()}
        for name, norm in weights.items():
            if name != GLOBAL:
                metrics[f"diag/weight_norm/{name}"] = norm
                # A group of all-zero weights (a zero-initialised projection) has no ratio: NaN, dropped in _log.
                metrics[f"diag/update_ratio/{name}"] = updates[name] / norm
        return metrics, grads[GLOBAL]

    def _enter_spikes(self, trainer: L.Trainer) -> dict[str, float]:
        """Reads the pending steps' losses and gradient norms in one transfer and enters them into the detector in
        step order. A spike at an earlier step is logged at that step; returns the metrics of the last step."""
        pending, self._pending = self._pending, []
        tensors = [t for _, loss, grad in pending for t in (loss, grad) if t is not None]
        values = iter(torch.stack([t.reshape(()).float().to(tensors[0].device) for t in tensors]).tolist()
                      if tensors else ())
        metrics: dict[str, float] = {}
        for i, (step, loss, grad) in enumerate(pending):
            loss_value = next(values) if loss is not None else None
            grad_value = next(values) if grad is not None else None
            metrics = self._spikes(trainer, step, loss_value, grad_value)
            if metrics and i < len(pending) - 1:
                self._log(trainer, metrics, step)
        return metrics

    def _spikes(self, trainer: L.Trainer, step: int, loss_value: float | None,
                grad_value: float | None) -> dict[str, float]:
        score = self.spikes.update(loss=loss_value, grad_norm=grad_value)
        self._max_score = max(self._max_score, score)
        spike = score > self.spikes.threshold
        if spike and trainer.is_global_zero:
            log.warning(f"loss spike at step {step}: score {score:.1f} sigma (loss {loss_value}, gradient norm "
                        f"{grad_value}); {self.spikes.count} spike(s) so far")
        if not (spike or self.due(step)):
            return {}
        metrics = {"diag/spike_score": score if spike else self._max_score, SPIKE_COUNT: self.spikes.count}
        self._max_score = 0.0
        return metrics

    def _log(self, trainer: L.Trainer, metrics: dict[str, torch.Tensor | float], step: int) -> None:
        if not metrics or not trainer.is_global_zero:
            return
        tensors = [v for v in metrics.values() if isinstance(v, torch.Tensor)]
        synced = iter(torch.stack([t.detach().float().reshape(()).to(tensors[0].device) for t in tensors]).tolist()
                      if tensors else [])
        values = {name: (next(synced) if isinstance(v, torch.Tensor) else float(v)) for name, v in metrics.items()}
        values = {name: v for name, v in values.items()
                  if math.isfinite(v) or not name.startswith("diag/update_ratio/")}
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)
