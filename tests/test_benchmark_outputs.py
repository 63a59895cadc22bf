"""Benchmark outputs and the docs' generated blocks (benchmarks/outputs.py): every block of
docs/benchmarks.md and docs/launches.md is its committed output's rendering, a changed figure or a missing
output is caught, and no table of figures lands in those docs without an output behind it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks import outputs
from benchmarks.outputs import DOCS, render_blocks, renderer, stale_blocks, write_output

REPO = Path(__file__).resolve().parent.parent
PRESETS_BLOCK = "docs/benchmarks/results/plan-presets.json"
MEASURED_BEFORE = "Measured before outputs were recorded (no output file); "
NOT_MEASURED = {"| key | default | meaning |"}
"""Tables of those docs that state no measured figure (docs/launches.md's LoRA settings)."""
PROVENANCE_KEYS = {"command", "commit", "uncommitted_changes", "cpu", "cpu_count", "threads", "load_1min",
                   "finished_at"}  # fmt: skip


def _block(path: str, body: str) -> str:
    return f"<!-- BEGIN generated: {path} -->\n{body}<!-- END generated -->\n"


def test_every_generated_block_of_the_benchmark_docs_is_its_committed_output():
    for doc in DOCS:
        assert stale_blocks(REPO / doc) == [], "run 'python -m benchmarks.outputs refresh'"
    assert PRESETS_BLOCK in render_blocks(REPO / "docs" / "launches.md")
    assert outputs.main(["check"]) == 0


def test_a_changed_figure_in_a_block_is_reported(tmp_path):
    doc = tmp_path / "launches.md"
    text = (REPO / "docs" / "launches.md").read_text(encoding="utf-8")
    begin = text.index(f"<!-- BEGIN generated: {PRESETS_BLOCK} -->")
    changed = text[:begin] + text[begin:].replace("71.9 GB", "70.9 GB", 1)
    assert changed != text
    doc.write_text(changed, encoding="utf-8")
    (problem,) = stale_blocks(doc)
    assert PRESETS_BLOCK in problem and "-| `gpu-1`" in problem and "70.9 GB" in problem


def test_a_block_without_an_output_or_without_a_renderer_is_reported(tmp_path):
    doc = tmp_path / "doc.md"
    missing, unknown = "docs/benchmarks/results/load-nowhere.json", "docs/benchmarks/results/nobody.json"
    doc.write_text("# x\n" + _block(missing, "| a |\n") + "\n" + _block(unknown, "| b |\n"), encoding="utf-8")
    problems = stale_blocks(doc)
    assert len(problems) == 2
    assert f"{missing}: no such output" in problems[0]
    assert f"no renderer for {unknown}" in problems[1]
    assert render_blocks(doc) == {}


def test_an_output_variant_renders_like_its_kind():
    assert renderer("plan-measured-complementary") is renderer("plan-measured")
    assert renderer("import-memory-uvicorn") is renderer("import-memory")
    assert renderer("plan") is None and renderer("nobody") is None


def test_a_text_with_a_pipe_and_line_breaks_stays_one_cell_of_its_row():
    text = outputs.rows_table({"rows": [{"reply": "North\n<search>a | b", "n": 1}]})
    header, rule, row = text.split("\n")
    assert row == "| North ⏎ <search>a \\| b | 1 |"
    assert len(re.findall(r"(?<!\\)\|", row)) == len(re.findall(r"\|", header))


def test_write_output_writes_figures_and_provenance_and_refreshes_the_block(tmp_path):
    doc = tmp_path / "docs" / "launches.md"
    doc.parent.mkdir()
    doc.write_text("# Launches\n\n" + _block(PRESETS_BLOCK, "old table\n") + "\nafter\n", encoding="utf-8")
    figures = {"presets": [{"preset": "cpu", "for": "a box", "models": "tiny", "nproc": 1,
                            "peaks": [["grpo", 9.5]], "host_gb_per_rank": 0.0}]}  # fmt: skip
    path = write_output("plan-presets", figures, ["python", "benchmarks/plan_presets.py"], root=tmp_path)
    assert path == tmp_path / PRESETS_BLOCK
    output = json.loads(path.read_text(encoding="utf-8"))
    assert output["name"] == "plan-presets" and output["figures"] == figures
    assert set(output["provenance"]) == PROVENANCE_KEYS
    assert output["provenance"]["command"] == "python benchmarks/plan_presets.py"
    text = doc.read_text(encoding="utf-8")
    assert "old table" not in text and "| `cpu` | a box | tiny | 9.5 GB (grpo) |" in text
    assert "Output of `python benchmarks/plan_presets.py` (commit " in text and text.endswith("\nafter\n")
    assert stale_blocks(doc, root=tmp_path) == []


def _tables(text: str) -> list[tuple[int, str]]:
    """Each markdown table of ``text``: (its header's line index, the header)."""
    lines = text.splitlines()
    return [
        (i, line)
        for i, line in enumerate(lines[:-1])
        if line.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())
        and (i == 0 or not lines[i - 1].startswith("|"))
    ]  # fmt: skip


def _inside_a_block(text: str, line_index: int) -> bool:
    before = "\n".join(text.splitlines()[:line_index])
    return before.rfind("<!-- BEGIN generated:") > before.rfind("<!-- END generated -->")


def test_every_table_of_figures_is_generated_or_says_it_has_no_output():
    for doc in DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        lines = text.splitlines()
        for i, header in _tables(text):
            if header in NOT_MEASURED or _inside_a_block(text, i):
                continue
            above = next((line for line in reversed(lines[:i]) if line.strip()), "")
            assert above.startswith(MEASURED_BEFORE), f"{doc}: a table with no output behind it: {header}"
            assert "docs/benchmarks/results/" in above, f"{doc}: name the output that will replace: {header}"


def test_the_table_scan_sees_a_new_hand_written_table():
    text = "# x\n\nSome prose.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    (index, header), = _tables(text)  # fmt: skip
    assert header == "| a | b |" and not _inside_a_block(text, index)
