"""Trackers people already use, fed the same metrics as the run's own record.

- ``TensorBoardReporter``: a reporter that writes each step's and each evaluation's metrics as TensorBoard
  scalars while the run trains (``tracking.tensorboard = true``; files in ``<run folder>/tensorboard/``);
- ``export_tensorboard``, ``export_wandb_offline``, ``export_csv``: the same for a finished run, from its
  stored rows (``manage.py export_run``).

Tags are the trainer's metric names (``train/success``, ``actor/loss``, ``eval/with_exp/success``): train and
eval keys never collide, since every eval key starts with ``eval/``. Steps are the run's actor steps.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import RunConfig
from trainer.report import BaseReporter

TENSORBOARD_DIR = "tensorboard"
"""The folder inside a run's folder that its TensorBoard event files go to."""
WANDB_PROJECT = "complementary-rl-studio"


class TrackerUnavailable(RuntimeError):
    """A tracker's package is not installed; the message says what to do."""


@dataclass(frozen=True)
class MetricRecord:
    """One stored row of a run's metrics: ``kind`` 'train' or 'eval', ``wall_time`` s since the start."""

    kind: str
    step: int
    wall_time: float
    values: Mapping[str, Any]


def scalars(kind: str, values: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a row under their tracker tags (text and booleans are not metrics)."""
    out = {}
    for key, value in values.items():
        if type(value) in (int, float):
            tag = key if kind != "eval" or key.startswith("eval/") else f"eval/{key}"
            out[tag] = float(value)
    return out


def _summary_writer(log_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter  # torch and tensorboard: heavy, only when exporting

    return SummaryWriter(log_dir=str(log_dir))


class TensorBoardReporter(BaseReporter):
    """Writes every step's and evaluation's metrics as TensorBoard scalars, flushed as they come (a
    ``tensorboard --logdir`` pointed at the run's folder shows a running run)."""

    def __init__(self, log_dir: Path) -> None:
        self.writer = _summary_writer(Path(log_dir))

    def _write(self, kind: str, step: int, metrics: Mapping[str, Any]) -> None:
        for tag, value in scalars(kind, metrics).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._write("train", step, metrics)

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        self._write("eval", step, metrics)

    def close(self) -> None:
        self.writer.close()


def tracker_reporters(cfg: RunConfig, out_dir: Path) -> list[TensorBoardReporter]:
    """The trackers ``cfg.tracking`` turns on for a run training in ``out_dir`` (the caller closes them)."""
    if cfg.tracking.tensorboard:
        return [TensorBoardReporter(Path(out_dir) / TENSORBOARD_DIR)]
    return []


# ---- exports of a finished run -----------------------------------------------------------------------


def export_tensorboard(records: Iterable[MetricRecord], out_dir: Path, *, start_time: float) -> Path:
    """Event files in ``out_dir`` with every metric of ``records``; wall times are ``start_time`` (Unix
    seconds) plus each row's offset, so TensorBoard's relative and wall-time axes are the run's own."""
    writer = _summary_writer(Path(out_dir))
    try:
        for r in records:
            for tag, value in scalars(r.kind, r.values).items():
                writer.add_scalar(tag, value, r.step, walltime=start_time + r.wall_time)
    finally:
        writer.close()
    return Path(out_dir)


def export_csv(records: Iterable[MetricRecord], path: Path) -> Path:
    """One line per value: ``kind, step, wall_time, metric, value`` (a long table any tool can pivot)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["kind", "step", "wall_time", "metric", "value"])
        for r in records:
            for tag, value in scalars(r.kind, r.values).items():
                writer.writerow([r.kind, r.step, r.wall_time, tag, value])
    return path


def export_wandb_offline(
    records: Iterable[MetricRecord], out_dir: Path, *, name: str, config: Mapping[str, Any]
) -> Path:
    """A W&B offline run under ``out_dir/wandb/`` (``wandb sync`` uploads it); needs the ``wandb`` package.
    W&B wants each step logged once and in order, so a step's train and eval values go in one call."""
    try:
        import wandb  # optional: not a dependency of the project
    except ImportError:
        raise TrackerUnavailable(
            "the wandb package is not installed, so no W&B offline run can be written. Install it "
            "(pip install wandb) and export again, or export with --format tensorboard or csv."
        ) from None
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for r in records:
        by_step[r.step] |= scalars(r.kind, r.values)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(mode="offline", dir=str(out_dir), project=WANDB_PROJECT, name=name, config=dict(config))
    try:
        for step in sorted(by_step):
            run.log(by_step[step], step=step)
    finally:
        run.finish()
    return out_dir / "wandb"
