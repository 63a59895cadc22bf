"""``verify``: the committed reports and the README's summaries are what the committed run files give, and one
changed number anywhere is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.trainer.test_experiments import write_fake_grid
from trainer.experiments.summary import (
    SUMMARY_FILE,
    compare_readme,
    include_summary,
    readme_blocks,
    verify,
    write_report,
)

REPO = Path(__file__).resolve().parents[2]
GRIDS = ("room-random", "room-5x5", "dark-pool")


def _block(name: str) -> str:
    return f"docs/experiments/{name}/report/{SUMMARY_FILE}"


@pytest.mark.parametrize("name", GRIDS)
def test_a_committed_grid_verifies_against_its_run_files_and_the_readme(name):
    assert verify(REPO / "docs" / "experiments" / name, REPO / "docs" / "results.md", _block(name)) == []


def test_the_readme_includes_every_committed_grids_summary_and_its_final_banks_match_the_runs():
    blocks = readme_blocks(REPO / "docs" / "results.md")
    assert sorted(blocks) == sorted(_block(n) for n in GRIDS)
    assert "330 (s0; 20/20), 305 (s1; 20/20), 274 (s2; 20/20)" in blocks[_block("room-random")]
    assert "426 (s0; 20/20), 372 (s1; 20/20), 441 (s2; 20/20)" in blocks[_block("room-5x5")]


def test_one_number_changed_in_a_copy_of_a_committed_report_fails_verify(tmp_path):
    copy = tmp_path / "room-5x5"
    shutil.copytree(REPO / "docs" / "experiments" / "room-5x5", copy)
    report = copy / "report" / "report.md"
    text = report.read_text()
    line = next(x for x in text.splitlines() if x.startswith("| complementary-s0 | 426 |"))
    report.write_text(text.replace(line, line.replace("| 426 |", "| 427 |", 1)))
    differences = verify(copy)
    assert f"-{line.replace('| 426 |', '| 427 |', 1)}" in differences and f"+{line}" in differences
    assert all("report.md" in d or d.startswith(("-", "+", "@@")) for d in differences)


def test_a_readme_whose_block_is_stale_or_missing_fails(tmp_path):
    write_fake_grid(tmp_path)
    summary = (write_report(tmp_path) / SUMMARY_FILE).read_text()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n<!-- BEGIN generated: grid/summary.md -->\n{summary}<!-- END generated -->\n")
    assert compare_readme(readme, "grid/summary.md", summary) == []
    readme.write_text(
        readme.read_text().replace(
            "| grpo/s0 | 0.000 / 0.200 / 0.400 |", "| grpo/s0 | 0.000 / 0.200 / 0.410 |"
        )
    )
    stale = compare_readme(readme, "grid/summary.md", summary)
    assert "-| grpo/s0 | 0.000 / 0.200 / 0.410 |" in "\n".join(stale)
    assert compare_readme(readme, "other/summary.md", summary) == [
        f"{readme}: no '<!-- BEGIN generated: other/summary.md -->' block: include the summary"
    ]


def test_the_report_refreshes_only_the_readmes_block_of_its_summary(tmp_path):
    readme = tmp_path / "README.md"
    other = "<!-- BEGIN generated: b/summary.md -->\nkept\n<!-- END generated -->\n"
    readme.write_text(
        f"# x\n<!-- BEGIN generated: a/summary.md -->\nold 0.5\n<!-- END generated -->\n{other}tail\n"
    )
    assert include_summary(readme, "a/summary.md", "new 0.6\n")
    assert (
        readme.read_text()
        == f"# x\n<!-- BEGIN generated: a/summary.md -->\nnew 0.6\n<!-- END generated -->\n{other}tail\n"
    )
    assert not include_summary(readme, "c/summary.md", "x\n")
