"""Experiments end to end: a tiny grid (2 methods × 1 seed × 1 step) trains on the real models and services,
running it again skips finished cells, its report has every section, and its pages follow run visibility."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from trainer.experiments.spec import ExperimentSpec
from trainer.paths import var_dir
from trainer.rollout.base import native_bf16
from trainer.runfiles import FAILURES_FILE, read_lines
from webapp.experiments import cell_dir, emulated_bf16_note, experiment_run, results_dir
from webapp.models import Experiment, MetricRow, Run

pytestmark = pytest.mark.django_db(transaction=True)

TINY = {
    "tasks_per_step": 1,
    "k_rollouts": 4,
    "eval_every": 0,
    "eval_episodes": 1,
    "checkpoint_every": 1,
    "checkpoint_keep": 1,
    "rollout.engine": "hf",
    "rollout.turn_limit": 2,
    "rollout.max_new_tokens": 8,
    "rollout.context_tokens": 1024,
    "extractor.max_new_tokens": 48,
    "extractor.buffer_size": 2,
    "experience.warmup_steps": 0,
    "experience.merge_every": 1,
}


def write_experiment(folder: Path, name: str, seeds: tuple[int, ...] = (0, 1)) -> Path:
    lines = [
        f'name = "{name}"',
        'description = "tiny grid"',
        'base = "cpu"',
        'methods = ["grpo", "complementary"]',
        f"seeds = {list(seeds)}",
        "[set]",
    ]
    lines += [f'"{k}" = {json.dumps(v)}' for k, v in TINY.items()]
    lines += ["[budget]", "steps = 1"]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def experiment_file(tmp_path, settings):
    """A tiny experiment with a unique name; its training folders are removed afterwards."""
    settings.EXPERIMENT_RESULTS_DIR = tmp_path / "results"
    name = f"tiny-{uuid.uuid4().hex[:8]}"
    yield write_experiment(tmp_path, name)
    shutil.rmtree(var_dir() / "experiments" / name, ignore_errors=True)


@pytest.mark.timeout(1500)
def test_a_tiny_grid_trains_end_to_end_is_skipped_when_done_and_reports_every_section(user, experiment_file):
    experiment_file = write_experiment(experiment_file.parent, experiment_file.stem, seeds=(0,))  # 2 cells
    out = io.StringIO()
    call_command("experiment", "run", str(experiment_file), "--here", "--owner", user.username, stdout=out)
    spec = ExperimentSpec.from_file(experiment_file)
    experiment = Experiment.objects.get(name=spec.name)
    runs = {r.cell: r for r in experiment.runs.all()}
    assert sorted(runs) == ["complementary/s0", "grpo/s0"], out.getvalue()
    for cell in spec.cells():
        run = runs[cell.key]
        assert run.status == Run.Status.SUCCEEDED, (cell.key, run.error)
        assert run.checkpoint_dir == str(cell_dir(spec.name, cell)) and run.seed == cell.seed
        assert list(MetricRow.objects.filter(run=run, kind="train").values_list("step", flat=True)) == [1]
        files = results_dir(spec.name) / "runs" / cell.slug
        assert {"cell.json", "config.json", "metrics.jsonl", "episodes.jsonl"} <= {
            p.name for p in files.iterdir()
        }
        columns = 2 if cell.config.uses_experience else 1  # the evaluations' episodes come along
        evaluated = [e["step"] for e in read_lines(files / "episodes.jsonl") if e["eval"]]
        assert evaluated == [0] * columns + [1] * columns
        assert len(list(Path(run.checkpoint_dir).glob("checkpoints/step-*"))) == 1  # checkpoint_keep = 1
    last = MetricRow.objects.filter(run=runs["complementary/s0"], kind="train").get().values
    assert last["extractor/distil_calls"] >= 1 and "extractor/buffer" in last  # the extractor's track ran
    cell = "complementary/s0"  # every unparseable answer kept whole, with why
    failures = read_lines(Path(runs[cell].checkpoint_dir) / FAILURES_FILE)
    assert len(failures) == last["extractor/parse_failures"]
    assert all(f["errors"] and f["job"] in ("distil", "merge", "refine") for f in failures)
    if failures:
        copied = results_dir(spec.name) / "runs" / cell.replace("/", "-") / FAILURES_FILE
        assert read_lines(copied) == failures

    again = io.StringIO()
    call_command("experiment", "run", str(experiment_file), "--here", "--owner", user.username, stdout=again)
    assert again.getvalue().count(": done") == 2 and experiment.runs.count() == 2

    call_command("experiment", "report", spec.name, stdout=io.StringIO())
    md = (results_dir(spec.name) / "report" / "report.md").read_text()
    for heading in (
        "## 1. Evaluation success",
        "## 2. Final evaluation in the paper's Table 1 layout",
        "## 3. What the experience did",
        "### Guided vs free",
        "### Bank quality",
        "## 4. What the extractor did",
        "## 5. Cost",
    ):
        assert heading in md, heading
    assert "| grpo | 1 |" in md and "| complementary | 1 |" in md  # the cost table has both arms


def test_an_unfinished_cell_is_resumed_and_a_live_one_left_to_its_worker(user, experiment_file, monkeypatch):
    spec = ExperimentSpec.from_file(experiment_file)
    said: list[str] = []
    queued: list[int] = []
    monkeypatch.setattr("webapp.queueing._enqueue", queued.append)
    experiment_run(spec, user, only=["grpo"], say=said.append)
    runs = {r.cell: r for r in Run.objects.filter(experiment__name=spec.name)}
    assert sorted(runs) == ["grpo/s0", "grpo/s1"] and sorted(queued) == sorted(r.pk for r in runs.values())
    assert all("queued, from the start" in line for line in said)

    Run.objects.filter(pk=runs["grpo/s0"].pk).update(status=Run.Status.FAILED, error="killed")
    assert runs["grpo/s1"].claim("a-worker")  # running, beating: live
    said.clear()
    queued.clear()
    experiment_run(spec, user, only=["grpo"], say=said.append)
    assert (
        queued == [runs["grpo/s0"].pk] and Run.objects.get(pk=runs["grpo/s0"].pk).status == Run.Status.QUEUED
    )
    assert any("grpo/s1: running on a-worker" in line for line in said), said


def test_a_cell_started_under_another_config_waits_for_a_restart_that_keeps_the_old_run(
    user, experiment_file, monkeypatch
):
    spec = ExperimentSpec.from_file(experiment_file)
    said: list[str] = []
    queued: list[int] = []
    monkeypatch.setattr("webapp.queueing._enqueue", queued.append)
    experiment_run(spec, user, only=["grpo/s0"], say=said.append)
    old = Run.objects.get(experiment__name=spec.name, cell="grpo/s0")
    config = old.config  # as if the file had changed since: another lr, two settings that did not exist then
    config["actor"]["lr"] = 0.5
    del config["rollout"]["turn_limit"]  # the cell sets it off its default: a difference
    del config["rollout"]["top_p"]  # the cell leaves it at its default, the code's behaviour before it
    config["extractor"]["temperature"] = 0.1  # grpo never reads it: not a difference that counts
    Run.objects.filter(pk=old.pk).update(config=config, status=Run.Status.FAILED, error="killed")
    folder = Path(old.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    said.clear()
    queued.clear()

    experiment_run(spec, user, only=["grpo/s0"], say=said.append)
    assert queued == [] and "not resumed" in said[0] and "--restart grpo/s0" in said[0]
    status = io.StringIO()
    call_command("experiment", "status", str(experiment_file), stdout=status)
    assert "started under another config: actor.lr: 0.5 then" in status.getvalue()
    assert "actor.lr: 0.5 then, 1e-05 now" in said[0]
    assert "rollout.turn_limit: '(not a setting then)'" in said[0]
    assert "extractor" not in said[0] and "top_p" not in said[0]

    experiment_run(spec, user, only=["grpo/s0"], restart=["grpo/s0"], say=said.append)
    old.refresh_from_db()
    new = Run.objects.get(experiment__name=spec.name, cell="grpo/s0")
    assert new.pk != old.pk and queued == [new.pk] and new.config == spec.cells()[0].config.to_dict()
    assert old.experiment is None and old.name.endswith("(replaced)") and old.status == Run.Status.FAILED
    assert (Path(old.checkpoint_dir) / "metrics.jsonl").read_text() == '{"step": 1}\n'  # nothing lost
    assert not folder.exists() or not (folder / "metrics.jsonl").exists()

    assert new.claim("a-worker")  # a live cell is not restarted under its worker
    with pytest.raises(CommandError, match="cancel it first"):
        call_command(
            "experiment",
            "run",
            str(experiment_file),
            "--only",
            "grpo/s0",
            "--restart",
            "grpo/s0",
            "--owner",
            user.username,
            stdout=io.StringIO(),
        )


def test_a_run_started_by_hand_in_a_cells_folder_is_adopted(user, experiment_file):
    spec = ExperimentSpec.from_file(experiment_file)
    cell = spec.cells()[0]
    by_hand = Run.objects.create(
        name="by hand",
        owner=user,
        config=cell.config.to_dict(),
        checkpoint_dir=str(cell_dir(spec.name, cell)),
        status=Run.Status.SUCCEEDED,
    )
    experiment_run(spec, user, only=[cell.key], say=lambda _: None)
    by_hand.refresh_from_db()
    assert by_hand.experiment.name == spec.name and by_hand.cell == cell.key
    assert Run.objects.filter(experiment__name=spec.name).count() == 1


def commit_results(spec: ExperimentSpec, key: str, lr: float | None = None) -> None:
    """Result files of a finished cell as another machine committed them (under ``lr`` if given)."""
    cell = next(c for c in spec.cells() if c.key == key)
    folder = results_dir(spec.name) / "runs" / cell.slug
    folder.mkdir(parents=True)
    config = cell.config.to_dict()
    config["actor"]["lr"] = lr or config["actor"]["lr"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "cell.json").write_text(json.dumps({"cell": key, "status": "succeeded"}))


def test_committed_results_count_as_done_in_a_new_database(user, experiment_file, monkeypatch):
    """var/ (database, checkpoints) stays on its machine; docs/experiments travels with the repository."""
    queued: list[int] = []
    monkeypatch.setattr("webapp.queueing._enqueue", queued.append)
    spec = ExperimentSpec.from_file(experiment_file)
    commit_results(spec, "grpo/s0")
    commit_results(spec, "grpo/s1", lr=0.5)  # made under another lr

    said: list[str] = []
    experiment_run(spec, user, only=["grpo"], say=said.append)
    assert said[0].startswith("grpo/s0: done (results committed in") and "queued" in said[1]
    runs = Run.objects.filter(experiment__name=spec.name)
    assert [r.cell for r in runs] == ["grpo/s1"] and queued == [runs[0].pk]
    out = io.StringIO()
    call_command("experiment", "status", str(experiment_file), stdout=out)
    status = {line.split()[0]: line for line in out.getvalue().splitlines()}
    assert "succeeded (committed results)" in status["grpo/s0"] and "queued" in status["grpo/s1"]
    assert "not started" in status["complementary/s0"]


def test_training_a_bf16_cell_here_warns_where_bf16_is_emulated(experiment_file):
    cell = ExperimentSpec.from_file(experiment_file).cells()[0]
    bf16 = dataclasses.replace(cell, config=cell.config.with_overrides(**{"rollout.dtype": "bfloat16"}))
    assert bool(emulated_bf16_note(bf16)) is not native_bf16()
    assert emulated_bf16_note(dataclasses.replace(bf16, config=cell.config)) == ""  # native: no warning


def test_the_status_of_an_experiment_never_run_lists_its_whole_grid(experiment_file):
    out = io.StringIO()
    call_command("experiment", "status", str(experiment_file), stdout=out)
    lines = out.getvalue().splitlines()
    assert "has not been run yet" in lines[0]
    assert [line.split()[:3] for line in lines[1:]] == [
        [cell, "not", "started"] for cell in ("grpo/s0", "complementary/s0", "grpo/s1", "complementary/s1")
    ]


def test_the_experiment_command_explains_a_bad_file(user, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nmethods = ["ppo"]\n')
    with pytest.raises(CommandError, match="ppo"):
        call_command("experiment", "run", str(bad), "--owner", user.username)
    with pytest.raises(CommandError, match="no result files"):
        call_command("experiment", "report", "never-run")


def test_experiment_pages_show_the_grid_and_hide_others_private_runs(
    client, user, other_user, experiment_file
):
    spec = ExperimentSpec.from_file(experiment_file)
    experiment = Experiment.objects.create(name=spec.name, owner=user, spec=spec.to_dict(), shared=False)
    mine = Run.objects.create(name="a", owner=user, config={}, experiment=experiment, cell="grpo/s0")
    assert client.get(reverse("experiments")).status_code == 302  # login required
    client.force_login(other_user)
    assert client.get(reverse("experiment_detail", args=[spec.name])).status_code == 404
    assert spec.name not in client.get(reverse("experiments")).content.decode()
    client.force_login(user)
    Run.objects.filter(pk=mine.pk).update(status=Run.Status.SUCCEEDED)
    listed = client.get(reverse("experiments")).content.decode()
    assert "1 / 4" in listed  # finished cells of the whole grid (2 arms x 2 seeds), not of the runs so far
    page = client.get(reverse("experiment_detail", args=[spec.name])).content.decode()
    assert reverse("run_detail", args=[mine.pk]) in page and "complementary" in page and "not started" in page
    assert client.get(reverse("experiment_report_file", args=[spec.name, "report.md"])).status_code == 404
    assert client.get(f"/experiments/{spec.name}/report/..%2F..%2Fsecret").status_code == 404
    assert client.get(f"/experiments/{spec.name}/report/config.json").status_code == 404


def test_experiment_pages_count_and_show_committed_cells_without_runs(client, user, experiment_file):
    spec = ExperimentSpec.from_file(experiment_file)
    commit_results(spec, "grpo/s0")
    commit_results(spec, "grpo/s1", lr=0.5)  # another config: not this grid's result
    Experiment.objects.create(name=spec.name, owner=user, spec=spec.to_dict())
    client.force_login(user)
    assert "1 / 4" in client.get(reverse("experiments")).content.decode()
    page = client.get(reverse("experiment_detail", args=[spec.name])).content.decode()
    grid = page[page.index('id="experiment-grid"') : page.index("</table>")]
    assert grid.count("results committed") == 1 and grid.count("not started") == 3


def test_the_report_renders_with_tables_and_plots_and_model_text_escaped(client, user, experiment_file):
    spec = ExperimentSpec.from_file(experiment_file)
    Experiment.objects.create(name=spec.name, owner=user, spec=spec.to_dict())
    report = results_dir(spec.name) / "report"
    report.mkdir(parents=True)
    (report / "report.md").write_text(
        "# Experiment\n\n| entry | title |\n|---|---|\n| 7 | <script>alert(1)</script> |\n\n"
        "![eval success](eval_success.png)\n\n[bad](javascript:alert(2))\n"
    )
    client.force_login(user)
    page = client.get(reverse("experiment_detail", args=[spec.name])).content.decode()
    assert "<table>" in page and "<td>7</td>" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    plot = reverse("experiment_report_file", args=[spec.name, "eval_success.png"]) + f"?owner={user.username}"
    assert f'<img src="{plot}" alt="eval success"' in page
    assert 'href="javascript:' not in page
