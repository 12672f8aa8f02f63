"""LanguageModel: next-token training of a GPT assembled from plugins."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torchmetrics.text import Perplexity

from lit.bits_per_byte import BitsPerByte
from lit.compile_mode import CompileOption
from lit.compute import gpt_flops_per_token
from lit.data import tokenizer_record
from lit.diagnostics import DiagnosticsConfig
from lit.errors import UserInputError
from lit.init_from import Growth, load_initial_weights
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.optim import with_installed_optimizers
from lit.readout_loss import chunk_tokens, readout_loss
from lit.task import EXECUTION_OPTIONS, ArchitectureTask


class LanguageModel(ArchitectureTask):
    """Causal language model. Never looks inside the architecture: ``arch`` says it all.

    Args:
        vocab_size: linked from the DataModule.
        block_size: context length; linked from the DataModule.
        arch: the transformer stack and its plugins.
        tie_embeddings: share the token embedding and the LM head.
        lr: peak learning rate.
        weight_decay: AdamW decay of matrices and embeddings (vectors never decay).
        betas: AdamW betas.
        warmup_steps: linear warmup length.
        min_lr_ratio: the cosine ends at ``lr * min_lr_ratio``.
        optimizer: the optimizer, one of the installed <optimizers>, routed by parameter role
            (``python cli.py plugins NAME`` shows its options).
        optimizer_options: its options, e.g. ``{lr_multipliers: {embedding: 0.3, head: 0.003125}}``
            (docs/optimizers.md).
        schedule: the learning-rate schedule: ``cosine`` (warmup + cosine) or ``wsd`` (warmup-stable-decay).
        schedule_options: ``wsd``'s ``cooldown_fraction`` (0.2), ``cooldown_steps`` (instead of the fraction) and
            ``cooldown_shape`` (``linear``, ``1-sqrt``, ``cosine``); it cools down to ``lr * min_lr_ratio``.
        max_new_tokens: tokens sampled per prompt by ``predict``.
        temperature: sampling temperature (0 = greedy).
        top_k: sample among the k most likely tokens only.
        init_from: a checkpoint whose weights start this run (optimizer and step start fresh); a TokenFormer
            checkpoint with fewer parameter tokens grows into this model.
        growth: how parameter tokens are added when growing.
        compile: ``false``, ``true``, ``reduce-overhead`` or ``auto`` (the default; lit/compile_mode.py).
        activation_checkpointing: recompute each block's activations in backward
            (recipes/trainer/activation_checkpointing.yaml).
        diagnostics: ``diag/*`` metrics every ``interval`` steps (``--model.diagnostics.interval=0``: off).
        bytes_per_token: linked from the DataModule. Validation and test log ``val/bpb``/``test/bpb`` (bits per
            byte, which compares models across tokenizers where nats per token do not) exactly from the
            DataModule's ``token_bytes`` (lit/bits_per_byte.py); this mean is used only where it has none.
        z_loss: coefficient of PaLM's auxiliary z-loss, mean(logsumexp(logits)^2), added to the training loss
            (PaLM: 1e-4; 0: off). Logged as ``train/z_loss`` (the term added); ``train/loss`` stays the
            cross-entropy, comparable with runs without it.
        loss_chunk_mib: the training loss reads the logits out a chunk of tokens at a time, each chunk's fp32 logits
            at most this many MiB, so the whole (tokens x vocab) logits never exist (lit/readout_loss.py): the same
            loss to float rounding, and bit-identical where a micro-batch fits one chunk (every small-vocabulary
            recipe). 0: the whole logits at once.
        random_numbers: how the run's random numbers are drawn: ``construction_order`` (seed once, then build:
            PyTorch's default) or ``by_name`` (each parameter's init keyed by its name, dropout by module and
            batch, so that variants start identical in what they share; what ``cli.py sweep`` uses).
    """

    ARCHITECTURE_OPTIONS = ("arch", "tie_embeddings")

    def __init__(self, vocab_size: int = 65, block_size: int = 256, arch: TransformerConfig = TransformerConfig(),
                 tie_embeddings: bool = False, lr: float = 1e-3, weight_decay: float = 0.1,
                 betas: tuple[float, float] = (0.9, 0.95), warmup_steps: int = 100, min_lr_ratio: float = 0.1,
                 optimizer: str = "adamw", optimizer_options: dict[str, Any] | None = None,
                 schedule: str = "cosine", schedule_options: dict[str, Any] | None = None,
                 max_new_tokens: int = 200, temperature: float = 0.8, top_k: int | None = None,
                 init_from: str | None = None, growth: Growth = Growth(),
                 compile: CompileOption = "auto", activation_checkpointing: bool = False,
                 diagnostics: DiagnosticsConfig = DiagnosticsConfig(), bytes_per_token: float | None = None,
                 z_loss: float = 0.0, loss_chunk_mib: float = 256.0,
                 random_numbers: Literal["construction_order", "by_name"] = "construction_order"):
        super().__init__(compile=compile, activation_checkpointing=activation_checkpointing, items="tokens",
                         diagnostics=diagnostics)
        if not z_loss >= 0:
            raise UserInputError(f"z_loss is a coefficient (PaLM uses 1e-4; 0 turns it off), got {z_loss}")
        if not loss_chunk_mib >= 0:
            raise UserInputError(f"loss_chunk_mib is the most MiB of fp32 logits per chunk of the training loss "
                                 f"(0: whole logits), got {loss_chunk_mib}")
        self.check_optimizer(optimizer, optimizer_options, schedule, schedule_options)
        # The resolved config is logged by the CLI; the logger need not log hparams a second time.
        self.save_hyperparameters(logger=False, ignore=EXECUTION_OPTIONS)
        self.model = self.build_model(lambda: GPT(vocab_size, block_size, arch, tie_embeddings),
                                      random_numbers)
        if init_from is not None:
            load_initial_weights(self, init_from, growth)
        self.val_ppl = Perplexity()
        self.val_bpb, self.test_bpb = BitsPerByte(), BitsPerByte()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def training_flops_per_item(self) -> float:
        return gpt_flops_per_token(self.model)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        idx, targets = batch
        hidden = self.model(idx, readout=False)
        loss, z = readout_loss(self.model.readout, hidden, targets,
                               chunk_tokens(self.hparams.vocab_size, self.hparams.get("loss_chunk_mib", 0.0)),
                               with_z=bool(self.hparams.z_loss))
        self.log_training_step(loss, idx.numel())
        if self.hparams.z_loss:
            auxiliary = self.hparams.z_loss * z
            self.log("train/z_loss", auxiliary)
            return loss + auxiliary
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        idx, targets = batch
        logits = self(idx)
        loss = self._loss(logits, targets)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self._log_bits_per_byte("val", self.val_bpb, logits, targets, loss)
        self.val_ppl(logits.float(), targets)
        self.log("val/ppl", self.val_ppl)

    def test_step(self, batch, batch_idx: int) -> None:
        idx, targets = batch
        logits = self(idx)
        loss = self._loss(logits, targets)
        per_token = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
        self.record_test_examples(loss=per_token.view(targets.shape).mean(1))  # one mean loss per window
        self.log("test/loss", loss, sync_dist=True)
        self._log_bits_per_byte("test", self.test_bpb, logits, targets, loss)

    def _log_bits_per_byte(self, stage: str, metric: BitsPerByte, logits: torch.Tensor, targets: torch.Tensor,
                           loss: torch.Tensor) -> None:
        """``<stage>/bpb``: exact where the data know each token's bytes (``token_bytes``, lit/bits_per_byte.py);
        else from a mean ``bytes_per_token`` (approximate), if the data give one; else not logged."""
        token_bytes = self._token_bytes()
        if token_bytes is not None:
            per_token = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
            metric(per_token, targets.flatten(), token_bytes)
            self.log(f"{stage}/bpb", metric)
        elif self.hparams.bytes_per_token:
            # nats per token -> bits per token -> bits per byte of the text those tokens encode.
            self.log(f"{stage}/bpb", loss / math.log(2) / self.hparams.bytes_per_token, sync_dist=True)

    def _token_bytes(self) -> torch.Tensor | None:
        """The data's bytes per token id on this device (``TextDataModule.token_bytes``), or None."""
        table = getattr(getattr(self._trainer, "datamodule", None), "token_bytes", None)
        if table is None:
            return None
        cached = getattr(self, "_token_bytes_on_device", None)
        if cached is None or cached.device != self.device or cached.shape != table.shape:
            self._token_bytes_on_device = cached = torch.as_tensor(table, dtype=torch.long).to(self.device)
        return cached

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        # The model carries the tokenizer its token ids mean (lit/data/tokenizer_record.py): evaluation, lm-eval
        # and export-hf check it before they read the model with another.
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if hasattr(datamodule, "tokenizer_record"):
            if not hasattr(self, "_tokenizer_record"):
                self._tokenizer_record = datamodule.tokenizer_record()
            if self._tokenizer_record is not None:
                checkpoint[tokenizer_record.CHECKPOINT_KEY] = self._tokenizer_record

    def predict_step(self, batch: torch.Tensor, batch_idx: int) -> list[str]:
        hp = self.hparams
        out = self.model.generate(batch, hp.max_new_tokens, hp.temperature, hp.top_k)
        texts = [self.trainer.datamodule.decode(row.tolist()) for row in out]
        for text in texts:
            print(text, flush=True)
        return texts


LanguageModel.__doc__ = with_installed_optimizers(LanguageModel.__doc__)
