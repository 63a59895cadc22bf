"""Result files hold each step row, eval row and episode once across resumes; reports refuse files that do
not, and count the extractor's work from its journals."""

from __future__ import annotations

import pytest

from tests.trainer.test_experiments import write_fake_grid
from trainer.config import get_preset
from trainer.experiments.report.cost import cumulative_total
from trainer.experiments.report.extractor import extractor_rows, search_and_ask_use
from trainer.experiments.report.merges import merge_attempts
from trainer.experiments.report.runs import load_results
from trainer.loop import sample_tasks
from trainer.report import EpisodeLogReporter, JsonlReporter, Reporters, report_eval_episodes
from trainer.rollout.runner import Episode, EpisodeSpec
from trainer.runfiles import (
    batch_sizes,
    last_attempt,
    last_batches,
    read_lines,
    repeated_rows,
    write_lines,
)

CFG = get_preset("cpu").with_overrides(seed=3, tasks_per_step=2, k_rollouts=4, steps=8, eval_every=4)


def _episodes(step: int) -> list[Episode]:
    success = step % 2 == 0
    return [
        Episode(spec, "", "", None, [], [], 0.0, success, False, [0], 0.0) for spec in sample_tasks(CFG, step)
    ]


def _eval_episodes(step: int) -> list[Episode]:
    """An evaluation's: 2 eval instances, without then with experience; the reward says which step's."""
    specs = [
        EpisodeSpec("MiniHack-Room-5x5", seed, seed, guided) for guided in (False, True) for seed in (0, 1)
    ]
    return [Episode(spec, "", "", None, [], [], float(step), False, False, [0], 0.0) for spec in specs]


def _evaluate(reporters: Reporters, step: int) -> None:
    """What ``TrainingLoop.evaluate`` hands its reporter: the episodes, then the metrics."""
    report_eval_episodes(reporters, step, _eval_episodes(step))
    reporters.on_eval(step, {"eval/success": step / 10, "eval/episodes": 2.0, "eval/with_exp/episodes": 2.0})


def _attempt(reporters: Reporters, start: int, stop: int) -> None:
    """The calls ``TrainingLoop.run`` makes from ``start`` until it dies after writing step ``stop``."""
    reporters.on_start(CFG.steps, start)
    if start == 1:
        _evaluate(reporters, 0)
    for step in range(start, stop + 1):
        reporters.on_episode_batch(step, _episodes(step))
        reporters.on_step(step, {"train/success": step / 10, "train/episodes": 8.0})
        if step % CFG.eval_every == 0 or step == CFG.steps:
            _evaluate(reporters, step)


def _files(folder):
    return Reporters(JsonlReporter(folder / "metrics.jsonl"), EpisodeLogReporter(folder / "episodes.jsonl"))


def _rows(folder) -> tuple[list, list]:
    rows = read_lines(folder / "metrics.jsonl")
    metrics = [(r["kind"], r["step"], r.get("train/success", r.get("eval/success"))) for r in rows]
    lines = read_lines(folder / "episodes.jsonl")
    episodes = [(e["eval"], e["step"], e["sample_seed"], e["guided"], e["reward"]) for e in lines]
    return metrics, episodes


def test_a_run_killed_between_checkpoints_and_resumed_writes_every_row_once(tmp_path):
    """Checkpoints at steps 4 and 8: the first attempt dies after writing step 6, the second after the
    untrained evaluation of a fresh start, then the run resumes from step 4's checkpoint."""
    never, broken = tmp_path / "never", tmp_path / "broken"
    _attempt(_files(never), 1, 8)
    _attempt(_files(broken), 1, 0)  # died after eval 0, before step 1's checkpoint: starts over
    _attempt(_files(broken), 1, 6)
    _attempt(_files(broken), 5, 8)
    assert _rows(broken) == _rows(never)
    assert repeated_rows(broken) == []
    lines = read_lines(broken / "episodes.jsonl")
    assert sum(not e["eval"] for e in lines) == 8 * 8
    evaluations = [(e["step"], e["guided"]) for e in lines if e["eval"]]
    assert evaluations == [(s, g) for s in (0, 4, 8) for g in (False, False, True, True)]  # each once


def test_a_report_reads_only_the_training_episodes_of_a_log_that_holds_evaluations_too(tmp_path):
    write_fake_grid(tmp_path)
    before = {r.slug: r.episodes for r in load_results(tmp_path)}
    for folder in (tmp_path / "runs").iterdir():
        evals = [r["step"] for r in read_lines(folder / "metrics.jsonl") if r["kind"] == "eval"]
        rows = read_lines(folder / "episodes.jsonl")
        rows += [{"step": s, "eval": True, "group": 0, "guided": True, "entry_id": 1, "success": True,
                  "actions": 1, "searches": 0} for s in evals]  # fmt: skip
        write_lines(folder / "episodes.jsonl", rows)
    assert {r.slug: r.episodes for r in load_results(tmp_path)} == before


def test_the_finishing_pass_of_a_run_that_died_after_its_last_step_replaces_that_steps_row(tmp_path):
    log = JsonlReporter(tmp_path / "metrics.jsonl")
    log.on_start(2, 1)
    log.on_step(1, {"extractor/merges": 0.0})
    log.on_step(2, {"extractor/merges": 1.0})
    again = JsonlReporter(tmp_path / "metrics.jsonl")
    again.on_start(2, 3)  # trainer.coevolution.work_left: all steps done, the extractor's work is not
    again.on_step(2, {"extractor/merges": 2.0})
    rows = read_lines(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["extractor/merges"]) for r in rows] == [(1, 0.0), (2, 2.0)]


def test_two_attempts_of_one_step_written_back_to_back_keep_the_last():
    rows = [{"kind": "eval", "step": 0, "v": "lost"}, {"kind": "eval", "step": 0, "v": 0}]
    rows += [{"kind": "step", "step": 1, "v": 1, "train/episodes": 2}]
    rows += [{"kind": "step", "step": 2, "v": "lost", "train/episodes": 2}]
    rows += [{"kind": "step", "step": 2, "v": 2, "train/episodes": 2}]
    kept = last_attempt(rows)
    assert [(r["step"], r["v"]) for r in kept] == [(0, 0), (1, 1), (2, 2)]
    episodes = [{"step": 1, "i": 0}, {"step": 1, "i": 1}] + [{"step": 2, "i": i} for i in range(4)]
    assert [(e["step"], e["i"]) for e in last_batches(episodes, batch_sizes(kept))] == [
        (1, 0),
        (1, 1),
        (2, 2),
        (2, 3),
    ]


def test_an_evaluations_episodes_are_a_batch_of_their_own_kept_once():
    metrics = [{"kind": "step", "step": 2, "train/episodes": 2}]
    metrics += [{"kind": "eval", "step": 2, "eval/episodes": 1, "eval/with_exp/episodes": 1}]
    assert batch_sizes(metrics) == {(False, 2): 2, (True, 2): 2}
    train = [{"step": 2, "i": i} for i in range(2)]
    evaluation = [{"step": 2, "eval": True, "i": i} for i in range(2)]
    twice = train + evaluation + train + evaluation  # two attempts of step 2 back to back
    kept = last_batches(twice, batch_sizes(metrics))
    assert [(e.get("eval", False), e["i"]) for e in kept] == [(False, 0), (False, 1), (True, 0), (True, 1)]


def test_a_run_folder_with_an_evaluation_logged_twice_is_refused(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{"kind": "eval", "step": 0, "eval/episodes": 2}])
    write_lines(tmp_path / "episodes.jsonl", [{"step": 0, "eval": True}] * 4)
    assert repeated_rows(tmp_path) == [
        "episodes.jsonl: the evaluation after step 0 has 4 episodes, it played 2"
    ]


def test_a_report_refuses_a_run_folder_with_rows_of_two_attempts(tmp_path):
    write_fake_grid(tmp_path)
    folder = tmp_path / "runs" / "grpo-s1"
    metrics = read_lines(folder / "metrics.jsonl")
    write_lines(folder / "metrics.jsonl", metrics[:3] + metrics[2:])
    with pytest.raises(
        ValueError, match=r"grpo-s1 holds rows of more than one attempt \(metrics.jsonl: eval 4"
    ):
        load_results(tmp_path)


def test_a_merge_pass_that_ran_twice_counts_as_two_attempts_of_one_pass_and_every_call():
    merges = [{"step": 5, "chunk": c} for c in (0, 1, 2)] + [{"step": 5, "chunk": c} for c in range(4)]
    merges += [{"step": 10, "chunk": 0}, {"step": 20, "chunk": 0}, {"step": 20, "chunk": 1}]
    assert merge_attempts(merges) == [(5, 3), (5, 4), (10, 1), (20, 2)]


def test_the_extractors_counts_come_from_its_journals(tmp_path):
    write_fake_grid(tmp_path)
    folder = tmp_path / "runs" / "complementary-s0"
    merges = read_lines(folder / "merges.jsonl")
    write_lines(folder / "merges.jsonl", merges + [m | {"id": 2} for m in merges])  # a second attempt
    write_lines(folder / "extractor_failures.jsonl", [{"job": "distil"}] * 3)
    run = next(r for r in load_results(tmp_path) if r.slug == "complementary-s0")
    row = extractor_rows(run)
    assert (row["merge"], row["merge_passes"], row["merge_attempts"]) == (2, 1, 2)
    assert (row["parse_failures"], row["ops_add"]) == (3, 2)


def test_a_cumulative_counter_that_restarted_at_a_resume_is_summed_over_both_attempts():
    assert cumulative_total([1.0, 2.5, 4.0, 0.5, 1.5]) == pytest.approx(5.5)
    assert cumulative_total([]) == 0.0


def test_search_and_ask_use_is_calls_per_episode_and_the_share_that_asked():
    use = search_and_ask_use([{"searches": 2}, {"searches": 0}, {"searches": 0}, {"searches": 1}])
    assert use == {"search_and_ask": 3.0, "asks_per_episode": 0.75, "episodes_asking": 0.5}
