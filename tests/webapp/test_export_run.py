"""manage.py export_run: a finished run's metric rows as TensorBoard event files, CSV, or W&B offline."""

from __future__ import annotations

import csv
import importlib.util

import pytest
from django.core.management import CommandError, call_command
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.config import get_preset
from webapp.models import MetricRow, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished_run(user):
    cfg = get_preset("cpu")
    run = Run.objects.create(
        name="finished", owner=user, config=cfg.to_dict(), status=Run.Status.SUCCEEDED, step=3
    )
    for step in (1, 2, 3):
        values = {"train/success": step / 4, "actor/loss": 0.5 - step / 8, "bank/size": 45.0 * step, "n": "x"}
        MetricRow.objects.create(run=run, step=step, wall_time=10.0 * step, values=values)
    for step in (0, 3):
        values = {"eval/success": step / 8, "eval/with_exp/success": step / 6}
        MetricRow.objects.create(run=run, step=step, kind="eval", wall_time=10.0 * step + 5, values=values)
    return run


def _table(run: Run) -> dict[str, list[tuple[int, float]]]:
    """The metrics table as tag -> [(step, value)], numbers only."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in MetricRow.objects.filter(run=run).order_by("step"):
        for key, value in row.values.items():
            if isinstance(value, float):
                out.setdefault(key, []).append((row.step, value))
    return out


def test_a_tensorboard_export_reads_back_as_the_metrics_table(finished_run, tmp_path):
    call_command("export_run", str(finished_run.pk), "--format", "tensorboard", "--out", str(tmp_path))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    exported = {
        tag: [(e.step, pytest.approx(e.value)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
    }
    assert exported == _table(finished_run) and "eval/with_exp/success" in exported
    start = finished_run.created_at.timestamp()
    assert [e.wall_time - start for e in acc.Scalars("train/success")] == pytest.approx([10, 20, 30])


def test_a_csv_export_and_the_refusals(finished_run, tmp_path, user):
    call_command("export_run", str(finished_run.uid), "--format", "csv", "--out", str(tmp_path / "m.csv"))
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    bank_size = {"kind": "train", "step": "3", "wall_time": "30.0", "metric": "bank/size", "value": "135.0"}
    assert bank_size in rows
    assert len(rows) == 3 * 3 + 2 * 2
    with pytest.raises(CommandError, match="no run 'nope'"):
        call_command("export_run", "nope")
    running = Run.objects.create(name="live", owner=user, status=Run.Status.RUNNING)
    with pytest.raises(CommandError, match="is running: export it once it has finished"):
        call_command("export_run", str(running.pk))


def test_wandb_offline_is_written_or_its_missing_package_named(finished_run, tmp_path):
    args = ("export_run", str(finished_run.pk), "--format", "wandb-offline", "--out", str(tmp_path))
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(CommandError, match=r"wandb package is not installed.*pip install wandb"):
            call_command(*args)
    else:
        call_command(*args)
        assert list((tmp_path / "wandb").glob("offline-run-*"))
