"""``manage.py experiment verify NAME``: passes where the committed report and the README's block are what the
run files give, fails with the differences where one number is not."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from tests.trainer.test_experiments import write_fake_grid
from trainer.experiments.summary import SUMMARY_FILE, write_report


@pytest.fixture
def grid(tmp_path, settings):
    """A grid's committed result files and report under a results folder, and a README that includes it."""
    settings.EXPERIMENT_RESULTS_DIR = tmp_path / "results"
    folder = tmp_path / "results" / "grid"
    write_fake_grid(folder)
    summary = (write_report(folder) / SUMMARY_FILE).read_text()
    readme = tmp_path / "README.md"
    block = f"docs/experiments/grid/report/{SUMMARY_FILE}"
    readme.write_text(f"# R\n\n<!-- BEGIN generated: {block} -->\n{summary}<!-- END generated -->\n")
    return folder, readme


def test_verify_passes_on_a_report_and_readme_built_from_the_run_files(grid):
    folder, readme = grid
    out = io.StringIO()
    call_command("experiment", "verify", "grid", "--readme", str(readme), stdout=out)
    assert f"grid: the committed report and the summary in {readme} match the run files" in out.getvalue()


def test_verify_fails_and_lists_the_line_when_one_number_of_the_committed_report_changed(grid):
    folder, readme = grid
    report = folder / "report" / "report.md"
    report.write_text(report.read_text().replace("| grpo-s1 | without experience | 4 | 0.450 |",
                                                 "| grpo-s1 | without experience | 4 | 0.451 |"))  # fmt: skip
    with pytest.raises(CommandError) as err:
        call_command("experiment", "verify", "grid", "--readme", str(readme), stdout=io.StringIO())
    assert "-| grpo-s1 | without experience | 4 | 0.451 |" in str(err.value)
    assert "+| grpo-s1 | without experience | 4 | 0.450 |" in str(err.value)


def test_verify_fails_when_the_readme_does_not_include_the_summary(grid):
    folder, readme = grid
    readme.write_text("# R\n")
    with pytest.raises(
        CommandError, match="no '<!-- BEGIN generated: docs/experiments/grid/report/summary.md"
    ):
        call_command("experiment", "verify", "grid", "--readme", str(readme), stdout=io.StringIO())


def test_verify_refuses_an_experiment_without_result_files(grid):
    with pytest.raises(CommandError, match="no result files in .*nothing/runs"):
        call_command("experiment", "verify", "nothing", stdout=io.StringIO())
