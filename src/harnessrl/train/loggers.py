"""Optional metric loggers beside metrics.jsonl: TensorBoard and Weights & Biases (offline).

Every metrics dict the trainer appends to RUN_DIR/metrics.jsonl also goes, scalar by scalar, to
TensorBoard (torch.utils.tensorboard event files in RUN_DIR/tensorboard) and/or a wandb run in
offline mode (RUN_DIR/wandb; `wandb sync` uploads it later). The x-axis is the line's number in
metrics.jsonl (from 1), which keeps rising where the trainer's `step` does not (a skipped update
logs its step again; a resumed run continues the file), and `step` is one of the scalars. One wandb
run per run folder: opening one finishes any run already active in the process. Both packages are
extras, imported only when asked for; a missing one is an error that names the extra to install.

Knows metric dicts and a run folder; knows nothing about training.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

LoggerName = Literal["tensorboard", "wandb"]


class MissingExtraError(ValueError):
    """A logger was asked for but its package is not installed."""


def check_installed(names: list[str]) -> list[str]:
    """`names` as given, or MissingExtraError for the first whose package is missing."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise MissingExtraError(f"loggers: {name!r} needs the {name} package: pip install 'harnessrl[{name}]'")
    return names


# a config field: `loggers: Loggers = Field(default_factory=list)` fails at load when one is missing
Loggers = Annotated[list[LoggerName], AfterValidator(check_installed)]


class MetricLoggers:
    """The loggers of one run folder, opened at the first `write`."""

    def __init__(self, run_dir: Path, names: Sequence[str]):
        self.run_dir, self.names = run_dir, check_installed(list(names))
        self.line: int | None = None  # metrics.jsonl line of the last write
        self._tensorboard: Any = None
        self._wandb: Any = None

    def write(self, metrics: dict[str, Any]) -> None:
        """Log `metrics`, which the caller has just appended to RUN_DIR/metrics.jsonl."""
        if self.line is None:
            self._open()
        self.line += 1
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, self.line)
            self._tensorboard.flush()  # a killed run keeps every line it logged
        if self._wandb is not None:
            self._wandb.log(scalars, step=self.line)

    def _open(self) -> None:
        jsonl = self.run_dir / "metrics.jsonl"
        with open(jsonl, encoding="utf-8") as f:
            self.line = sum(1 for _ in f) - 1  # the lines before the one being logged
        if "tensorboard" in self.names:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run hides what an earlier process logged past this line
            self._tensorboard = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=self.line + 1)
        if "wandb" in self.names:
            import wandb

            # one wandb run per run folder (the job's sft/ and its RL)
            if wandb.run is not None:
                wandb.run.finish()
            self._wandb = wandb.init(
                mode="offline",
                dir=str(self.run_dir),
                project="harnessrl",
                name=self.run_dir.name,
                # silent: wandb's exit notes would land on stdout after a command's JSON line
                settings=wandb.Settings(silent=True),
            )

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._tensorboard = self._wandb = None
        self.line = None
