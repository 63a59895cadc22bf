"""TensorBoard tracking while a run trains: the switch in the config, and what the event files hold."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.config import ConfigError, RunConfig, get_preset
from trainer.trackers import TENSORBOARD_DIR, TensorBoardReporter, scalars, tracker_reporters


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_is_off_by_default_and_switched_on_by_the_config(tmp_path):
    assert get_preset("cpu").tracking.tensorboard is False
    assert tracker_reporters(get_preset("cpu"), tmp_path) == []
    cfg = get_preset("cpu").with_overrides(**{"tracking.tensorboard": "true"})
    assert RunConfig.from_dict(cfg.to_dict()) == cfg and cfg.tracking.tensorboard
    (reporter,) = tracker_reporters(cfg, tmp_path)
    reporter.close()
    assert (tmp_path / TENSORBOARD_DIR).is_dir()
    with pytest.raises(ConfigError, match="tracking.tensorboard must be true or false"):
        get_preset("cpu").with_overrides(**{"tracking.tensorboard": "maybe"})


def test_the_reporter_writes_steps_and_evals_as_scalars(tmp_path):
    reporter = TensorBoardReporter(tmp_path)
    reporter.on_eval(0, {"eval/success": 0.25})
    reporter.on_step(1, {"train/success": 0.5, "actor/loss": -0.125, "note": "text is skipped"})
    reporter.on_step(2, {"train/success": 0.75, "actor/loss": 0.0})
    reporter.close()
    assert _scalars(tmp_path) == {
        "eval/success": [(0, 0.25)],
        "train/success": [(1, 0.5), (2, 0.75)],
        "actor/loss": [(1, -0.125), (2, 0.0)],
    }


def test_eval_keys_always_land_under_eval():
    assert scalars("eval", {"success": 1, "eval/actions": 2.5, "flag": True}) == {
        "eval/success": 1.0,
        "eval/actions": 2.5,
    }
    assert scalars("train", {"train/success": 0}) == {"train/success": 0.0}
