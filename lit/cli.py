"""``fit`` / ``validate`` / ``test`` / ``predict``: LightningCLI with MLflow on (the other subcommands are in
``lit/commands.py``).

Every model and DataModule is selected by class in the recipe (``model: {class_path: ...}``), so one
CLI serves every task. User mistakes end in one ``error:`` line and exit code 2, never a traceback wall.
"""

from __future__ import annotations

import sys
import warnings

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

# Imported so that recipes may name these classes by short name. The image task and DataModules are not: they
# import timm (and torchvision) when a recipe names them (lit.image_classifier.ImageClassifier,
# lit.data.DigitsDataModule), so a text run never pays for them.
import lit.data.text  # noqa: F401
import lit.language_model  # noqa: F401
from lit import command_line_over_checkpoint, sharded_build
from lit.checkpoint_writing import install as install_whole_checkpoint_writer
from lit.checkpoints import check_fits, checkpoint_shapes
from lit.data import tokenizer_record
from lit.errors import UserInputError, report
from lit.preemption import Interrupted, PreemptionCheckpoints
from lit.tracking.config_log import LogConfigToMLflow
from lit.tracking.run import MLflowRun, continue_checkpoint_run

DATA_FACTS = ("vocab_size", "block_size", "num_classes", "image_size", "in_chans", "bytes_per_token")
# --ckpt_path values that Lightning resolves itself (there is no file to check yet), or none at all.
LIGHTNING_CHECKPOINT_NAMES = (None, "last", "best", "hpc")


class OneLineErrorParser(LightningArgumentParser):
    """Parser errors (unknown key, bad type, missing file) as one line, not usage + a wall of text."""

    def error(self, message: str, ex: Exception | None = None):
        if not getattr(self, "exit_on_error", True):
            return super().error(message, ex)
        raise UserInputError(f"{_condense(str(message))} (see `python cli.py SUBCOMMAND --help`)")


# jsonargparse explains a failure inside a class_path as a tree that also lists every subtype it
# tried (here LightningModule or None); only the branch about the selected class helps the user.
_NOISE = ("Does not validate against any of the Union subtypes", "Subtypes", "Errors",
          "Expected a <class 'NoneType'>", "Given value", "Problem with given class_path")


def _condense(message: str) -> str:
    lines = [line.strip(" -:") for line in message.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith(_NOISE))


# Parsers kept for the next run in this process, by whether they have subcommands; None: build one per run.
_reused_parsers: dict[bool, tuple] | None = None


def reuse_parsers() -> None:
    """Build the CLI's parser once in this process and reuse it for every later run (a sweep worker runs
    many): building it resolves every class signature again, a second or more per run. A parse reads its
    arguments into a new namespace and leaves the parser as it was."""
    global _reused_parsers
    if _reused_parsers is None:
        _reused_parsers = {}


class ArchLabCLI(LightningCLI):
    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        if _reused_parsers is not None and add_subcommands in _reused_parsers:
            self.parser, self._subcommand_method_arguments, self._subcommand_parsers = \
                _reused_parsers[add_subcommands]
            return
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if _reused_parsers is not None:
            _reused_parsers[add_subcommands] = (self.parser, getattr(self, "_subcommand_method_arguments", None),
                                                getattr(self, "_subcommand_parsers", None))

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Facts of the data reach the model without being typed twice (they are not meant to be set).
        # A model that does not take a fact (a LanguageModel has no num_classes) ignores its link.
        for fact in DATA_FACTS:
            parser.link_arguments(f"data.{fact}", f"model.init_args.{fact}", apply_on="instantiate")
        # Always checkpoint, with last.ckpt for resuming; configurable as --checkpoint.*.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True})
        # SIGTERM / SIGUSR1 / Ctrl-C save last.ckpt and stop; last.ckpt is refreshed every few minutes too.
        parser.add_lightning_class_args(PreemptionCheckpoints, "preemption")
        parser.add_argument("--force", type=bool, default=False,
                            help="with --ckpt_path: read the model with data of another tokenizer than the one it "
                                 "was trained with (refused otherwise), saying so")

    def before_instantiate_classes(self) -> None:
        # The model is built before the trainer and its strategy: whether the processes other than rank 0 may build
        # it on the meta device is read from the configuration (lit/sharded_build.py).
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        sharded_build.request(sharded_build.asked_by_strategy(config.get("trainer", {}).get("strategy")))

    def instantiate_trainer(self, **kwargs) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # One MLflow run for all processes, resumed into, with system metrics. Added here rather than as the
        # default of --trainer.callbacks, which a user's own list of callbacks would replace.
        if not any(isinstance(c, MLflowRun) for c in trainer.callbacks):
            trainer.callbacks.insert(0, MLflowRun())
        install_whole_checkpoint_writer(trainer)  # a full disk never leaves a truncated file under a checkpoint's name
        return trainer

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        # The arguments as typed, for the flags that win over a checkpoint's hyperparameters (_parse_ckpt_path).
        self._typed_args = [str(a) for a in (sys.argv[1:] if args is None else args)] \
            if not isinstance(args, dict) else []
        with warnings.catch_warnings():
            # cli.py passes the process's own arguments on purpose (lit/commands.py strips nothing but routes them):
            # Lightning's warning about args given beside sys.argv would echo the whole command line twice.
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        # Lightning reads a --ckpt_path's hyperparameters before anything is built: a file that cannot be read
        # (truncated, foreign objects) must end in one line here rather than in a traceback.
        # Read once: the shapes are kept for the check against the model, once it is built.
        path = self._checkpoint_file()
        self._checkpoint_shapes = checkpoint_shapes(path) if path is not None else None
        subcommand = self.config.get("subcommand")
        typed = self.config[subcommand].clone() if subcommand else None
        super()._parse_ckpt_path()
        if path is not None and typed is not None:
            # Lightning parsed the checkpoint's hyperparameters over the command line; the user's flags win back.
            self.config[subcommand] = command_line_over_checkpoint.apply(
                typed, self.config[subcommand], self._typed_args, path)

    # Weights of another architecture are a one-line error before any setup, not a load_state_dict wall.
    def before_fit(self) -> None:
        self._check_checkpoint()
        # `fit --ckpt_path` continues the checkpoint's MLflow run: the run is created as fit sets up,
        # before Lightning reads the checkpoint, so the logger must know it now.
        path = self._checkpoint_file()
        if path is None and SLURMEnvironment.detect():  # a requeued job resumes from its hpc checkpoint
            path = self.trainer._checkpoint_connector._hpc_resume_path
        continue_checkpoint_run(self.trainer, path)

    def before_validate(self) -> None:
        self._check_checkpoint()

    def before_test(self) -> None:
        self._check_checkpoint()

    def before_predict(self) -> None:
        self._check_checkpoint()

    def _check_checkpoint(self) -> None:
        if self._checkpoint_shapes is not None:
            path = self._checkpoint_file()
            check_fits(path, self._checkpoint_shapes, self.model)
            if hasattr(self.datamodule, "tokenizer_record"):  # a language model and its token ids
                force = bool(self.config[self.config["subcommand"]].get("force"))
                tokenizer_record.check(tokenizer_record.recorded(path), self.datamodule.tokenizer_record(), path,
                                       force=force)

    def _checkpoint_file(self) -> str | None:
        """The --ckpt_path of this subcommand, unless it is a name Lightning resolves itself."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        return None if path in LIGHTNING_CHECKPOINT_NAMES else path


def trainer_defaults() -> dict:
    return {
        "logger": {"class_path": "lit.tracking.MLflowLogger"},
    }


def main(args: list[str] | None = None) -> LightningCLI:
    """Run LightningCLI on ``args`` (``fit --config ...``; default: the process's arguments)."""
    return _lightning_cli(args)


def check_config(args: list[str]) -> LightningCLI:
    """Build what ``fit`` would (model, data, trainer) from ``args`` (no subcommand) and run nothing.

    A sweep checks each variant this way before it spends compute: a user error ends in one line and
    exit code 2, as in ``fit``. Returns what was built.
    """
    return _lightning_cli(args, run=False)


def _lightning_cli(args: list[str] | None, run: bool = True) -> LightningCLI:
    try:
        return ArchLabCLI(
            LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
            save_config_callback=LogConfigToMLflow, trainer_defaults=trainer_defaults(),
            parser_class=OneLineErrorParser, args=args, run=run,
        )
    except Interrupted as exc:  # saved and stopped on a signal: say where to resume, exit as the signal asks
        if rank_zero_only.rank == 0:
            sys.stderr.write(f"stopped: {exc}\n")
        sys.exit(exc.exit_code)
    except Exception as exc:
        sys.exit(report(exc))  # a user error in one line; anything else keeps its traceback
