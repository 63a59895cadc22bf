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


def test_a_batch_whose_episodes_all_run_to_the_turn_limit_still_moves_and_estimates_from_its_turns():
    recorder = Recorder()
    progress = Progress(Reporters(recorder), every_s=0)
    progress.start(2, "rollouts", "episodes", 16)
    progress.started -= 30  # 30 s in
    progress.advance(0, 16, 10, 50)  # no episode has ended, turn 10 of at most 50
    assert [e[2:] for e in recorder.events] == [("rollouts", 0, 16), ("rollouts", 0, 16)]  # sent all the same
    snapshot = progress.snapshot()
    assert snapshot["turn"] == 10 and snapshot["turns"] == 50
    assert 119 < snapshot["eta_s"] < 125  # 40 turns left at 3 s a turn, at most
    progress.advance(0, 16, 10, 50)  # the same turn again: nothing new, nothing sent
    assert len(recorder.events) == 2
    progress.start(2, "actor update", "micro-batches", 4)  # a new phase forgets the turns
    assert "turn" not in progress.snapshot()
