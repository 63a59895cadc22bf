"""Evaluation episodes in the trajectory inspector: the run's reporter records them (both columns) beside the
training steps' episodes, the inspector and the API list and filter them, a resume writes each once, and the
training-only figures stay training-only."""

from __future__ import annotations

import pytest
from django.urls import reverse

from trainer.report import EpisodeLogReporter, Reporters, report_eval_episodes
from trainer.rollout.runner import Episode, EpisodeSpec, Experience, Turn
from trainer.runfiles import read_lines
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.progress import RunReporter
from webapp.training import rewind

pytestmark = pytest.mark.django_db

ENV = "MiniHack-Room-5x5"


def _episode(spec: EpisodeSpec, reward: float, action: str = "north") -> Episode:
    turn = Turn("a dark <room>", action, action, reward, False, True, 3, "stop", 1)
    experience = Experience("take the stairs <now>", entry_id=7, entry_version=1) if spec.guided else None
    return Episode(spec, "reach the stairs", "", experience, [turn], [], reward, reward > 0, False, [1], 0.1)


def _evaluation(step: int, instances: int = 2) -> list[Episode]:
    """What ``trainer.evaluate.evaluate`` hands out: each column's eval instances, without experience first;
    the with-experience column wins, the other loses."""
    return [
        _episode(
            EpisodeSpec(ENV, seed, seed, guided),
            float(guided),
            f"east {step} <{'with' if guided else 'w/o'}>",
        )
        for guided in (False, True)
        for seed in range(instances)
    ]


def _training(step: int) -> list[Episode]:
    return [_episode(EpisodeSpec(ENV, 1234, 0, k < 1, sample_seed=k), 0.0) for k in range(2)]


@pytest.fixture
def run(user) -> Run:
    return Run.objects.create(name="r", owner=user, status=Run.Status.RUNNING, method="complementary")


def _record(run: Run, tmp_path=None, evaluations=(0, 2), steps=(1, 2)) -> None:
    """A run's reporters as the loop calls them: evaluation 0, steps, the evaluation after step 2."""
    reporter = Reporters(
        RunReporter(run), *([EpisodeLogReporter(tmp_path / "episodes.jsonl")] if tmp_path else [])
    )
    reporter.on_start(2, 1)
    for step in sorted({*evaluations, *steps}):
        if step in steps:
            reporter.on_episode_batch(step, _training(step))
            reporter.on_step(step, {"train/success": 0.0, "train/episodes": 2.0})
        if step in evaluations:
            report_eval_episodes(reporter, step, _evaluation(step))
            reporter.on_eval(step, {"eval/success": 0.0, "eval/with_exp/success": 1.0})


def test_the_run_reporter_records_an_evaluations_episodes_as_eval_rows_with_their_column(run, tmp_path):
    _record(run, tmp_path)
    evals = EpisodeRecord.objects.filter(run=run, kind=EpisodeRecord.Kind.EVAL)
    assert sorted(evals.values_list("step", "guided", "seed")) == [
        (s, g, seed) for s in (0, 2) for g in (False, True) for seed in (0, 1)
    ]
    with_exp = evals.get(step=2, guided=True, seed=0)
    assert with_exp.injected_experience == "take the stairs <now>" and with_exp.experience_id == 7
    assert with_exp.success and with_exp.turns[0]["action_text"] == "east 2 <with>"
    assert EpisodeRecord.objects.filter(run=run, kind=EpisodeRecord.Kind.TRAIN).count() == 2 * 2
    # the run folder's log has the same rows, an evaluation's marked, its guided the column
    lines = read_lines(tmp_path / "episodes.jsonl")
    assert [(e["step"], e["eval"], e["guided"]) for e in lines if e["eval"]] == [
        (s, True, g) for s in (0, 2) for g in (False, False, True, True)
    ]
    assert sum(not e["eval"] for e in lines) == 2 * 2
    # an evaluation reported again (a retried attempt's) replaces its rows, as its metric row is replaced
    report_eval_episodes(RunReporter(run), 2, _evaluation(2, instances=1))
    assert evals.filter(step=2).count() == 2 and evals.filter(step=0).count() == 4


def test_the_inspector_lists_evaluations_beside_training_steps_and_shows_both_columns(
    client, user, other_user, run
):
    _record(run)
    client.force_login(user)
    url = reverse("run_inspect", args=[run.id])
    training = client.get(url).content.decode()
    assert "Rewards at step 2" in training and 'id="task-0"' in training and "east" not in training
    assert "Training steps (2)" in training and f'href="{url}?kind=eval">Evaluations (2)' in training

    page = client.get(url, {"kind": "eval"}).content.decode()
    assert "Rewards of the evaluation after step 2 (both columns)" in page
    picker = page.split('id="step-picker"')[1].split("</form>")[0]
    assert 'name="kind" value="eval"' in picker and "Evaluation after step" in picker
    assert '<option value="2" selected>2</option>' in picker and ">0 (untrained model)</option>" in picker
    assert f'id="eval-{ENV.lower()}-0"' in page and f'id="eval-{ENV.lower()}-1"' in page
    assert page.count("With experience (1)") == 2 and page.count("Without experience (1)") == 2
    assert "east 2 &lt;with&gt;" in page and "east 2 &lt;w/o&gt;" in page and "<with>" not in page
    assert "take the stairs &lt;now&gt;" in page and "a dark &lt;room&gt;" in page
    assert (
        "Rewards of the evaluation of the untrained model"
        in client.get(url, {"kind": "eval", "step": 0}).content.decode()
    )
    assert (
        "No evaluation after step 1 has recorded episodes"
        in client.get(url, {"kind": "eval", "step": 1}).content.decode()
    )
    highlighted = EpisodeRecord.objects.get(run=run, kind="eval", step=2, guided=True, seed=1)
    one = client.get(url, {"kind": "eval", "step": 2, "episode": highlighted.id}).content.decode()
    assert f'class="episode won highlight" id="episode-{highlighted.id}"' in one

    client.force_login(other_user)
    assert client.get(url, {"kind": "eval"}).status_code == 404
    client.logout()
    assert client.get(url, {"kind": "eval"}).status_code == 302


@pytest.mark.parametrize("kind", ["evaluation", "EVAL", "train,eval", "x" * 500])
def test_an_unknown_kind_is_a_400_naming_the_choices(client, user, run, kind):
    _record(run)
    client.force_login(user)
    response = client.get(reverse("run_inspect", args=[run.id]), {"kind": kind, "step": 2})
    assert response.status_code == 400 and "kind must be one of train, eval" in response.content.decode()
    assert client.get(reverse("run_inspect", args=[run.id]), {"kind": ""}).status_code == 200  # as step=


def test_the_empty_states_say_which_kind_is_missing_and_why(client, user, run):
    client.force_login(user)
    url = reverse("run_inspect", args=[run.id])
    _record(run, evaluations=(0,), steps=())  # running: evaluated the untrained model, in step 1 now
    training = client.get(url).content.decode()
    reason = training.split('id="no-episodes">')[1].split("</p>")[0]
    assert reason.startswith("No step has finished yet") and "under Evaluations" in reason
    assert f'href="{url}?kind=eval">Evaluations (1)' in training
    assert (
        "Rewards of the evaluation of the untrained model"
        in client.get(url, {"kind": "eval"}).content.decode()
    )

    ended = Run.objects.create(name="e", owner=user, status=Run.Status.FAILED)
    page = client.get(reverse("run_inspect", args=[ended.id]), {"kind": "eval"}).content.decode()
    assert "This run failed before any evaluation finished" in page
    # a run that evaluated before evaluation episodes were recorded has only their figures
    MetricRow.objects.create(run=ended, step=0, kind="eval", wall_time=1.0, values={"eval/success": 0.0})
    page = client.get(reverse("run_inspect", args=[ended.id]), {"kind": "eval"}).content.decode()
    assert "were not recorded episode by episode" in page and "Training steps (0)" in page


def test_the_run_pages_latest_evaluation_links_to_its_episodes(client, user, run):
    client.force_login(user)
    MetricRow.objects.create(run=run, step=0, kind="eval", wall_time=1.0, values={"eval/success": 0.0})
    assert (
        'id="latest-eval-episodes"' not in client.get(reverse("run_detail", args=[run.id])).content.decode()
    )
    _record(run)
    card = client.get(
        reverse("run_detail", args=[run.id]), headers={"HX-Request": "true", "HX-Target": "latest-eval"}
    )
    link = f'href="{reverse("run_inspect", args=[run.id])}?kind=eval&amp;step=2" id="latest-eval-episodes"'
    assert link in card.content.decode()


def test_the_api_lists_episodes_of_a_kind_and_refuses_an_unknown_one(client, user, run):
    _record(run)
    client.force_login(user)
    url = f"/api/v1/runs/{run.id}/episodes"
    evals = client.get(url, {"kind": "eval", "step": 2}).json()
    assert evals["count"] == 4 and {e["kind"] for e in evals["items"]} == {"eval"}
    assert [(e["seed"], e["guided"]) for e in evals["items"]] == [
        (0, False),
        (0, True),
        (1, False),
        (1, True),
    ]
    everything = client.get(url, {"step": 2, "limit": 100}).json()["items"]
    assert [e["kind"] for e in everything] == ["train"] * 2 + [
        "eval"
    ] * 4  # the step's training, then its eval
    assert client.get(url, {"kind": "train"}).json()["count"] == 4
    refused = client.get(url, {"kind": "evaluation"})
    assert refused.status_code == 422 and "kind" in str(refused.json())


def test_a_resume_keeps_the_evaluation_at_its_checkpoint_and_a_fresh_start_drops_the_untrained_ones(run):
    _record(run, evaluations=(0, 2), steps=(1, 2))
    rewind(run, 2)  # resumed from step 2's checkpoint, written after the evaluation of step 2
    assert EpisodeRecord.objects.filter(run=run, kind="eval").count() == 2 * 4
    rewind(run, 1)  # from step 1's: the evaluation after step 2 is redone
    assert sorted(set(EpisodeRecord.objects.filter(run=run, kind="eval").values_list("step", flat=True))) == [
        0
    ]
    _record(run, evaluations=(2,), steps=(2,))
    assert EpisodeRecord.objects.filter(run=run, kind="eval").count() == 2 * 4
    rewind(run, 0)  # no checkpoint: starts over and evaluates the untrained model again
    assert not EpisodeRecord.objects.filter(run=run).exists()
    _record(run)
    assert EpisodeRecord.objects.filter(run=run, kind="eval", step=0).count() == 4


@pytest.mark.parametrize(
    ("status", "words"),
    [
        ("queued", "is queued"),
        ("running", "No evaluation has finished yet"),
        ("cancelled", "was cancelled before"),
    ],
)
def test_the_evaluations_empty_state_fits_the_runs_state(client, user, status, words):
    run = Run.objects.create(name="r", owner=user, status=status)
    client.force_login(user)
    page = client.get(reverse("run_inspect", args=[run.id]), {"kind": "eval"}).content.decode()
    reason = page.split('id="no-episodes">')[1].split("</p>")[0]
    assert words in reason and "evaluation" in reason and 'id="step-picker"' not in page
