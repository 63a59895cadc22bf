"""``Progress``: what a reporter hears inside a long phase, and how often."""

from __future__ import annotations

from tests.trainer.recording import Recorder
from trainer.report import Progress, Reporters


def test_a_phase_reports_its_start_its_end_and_at_most_every_interval_between():
    recorder = Recorder()
    progress = Progress(Reporters(recorder), every_s=3600)
    progress.start(4, "evaluation", "episodes", 8)
    for done in range(1, 9):
        progress.advance(done)
    assert [e[2:] for e in recorder.events] == [("evaluation", 0, 8), ("evaluation", 8, 8)]

    recorder.events.clear()
    progress.every_s = 0
    progress.start(5, "rollouts", "episodes")
    progress.advance(1, 4)
    progress.advance(1, 4)  # nothing new: nothing sent
    progress.advance(3, 4)
    assert [e[1:] for e in recorder.events] == [
        (5, "rollouts", 0, 0),
        (5, "rollouts", 1, 4),
        (5, "rollouts", 3, 4),
    ]


def test_the_estimate_follows_the_pace_so_far():
    progress = Progress(None)
    progress.start(1, "rollouts", "episodes", 10)
    assert progress.snapshot()["eta_s"] is None  # nothing finished: no pace to go by
    progress.started -= 20  # 20 s in
    progress.advance(4)
    snapshot = progress.snapshot()
    assert snapshot["done"] == 4 and snapshot["elapsed_s"] >= 20
    assert 29 < snapshot["eta_s"] < 32  # 6 more at 5 s each


def test_a_reporter_without_the_hook_is_left_alone():
    class Plain:
        pass

    Progress(Plain()).start(1, "checkpoint")  # no on_progress: nothing to call, no error
