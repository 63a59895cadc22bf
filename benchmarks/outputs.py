"""Benchmark outputs: every figure a benchmark prints for the docs lands in a committed JSON file, and the
docs' tables are generated from those files.

    python -m benchmarks.outputs refresh   # rewrite every generated block of the docs from the outputs
    python -m benchmarks.outputs check     # list the blocks that differ from their outputs (exit 1)

A benchmark calls ``write_output(name, figures)``: ``docs/benchmarks/results/<name>.json`` holds the
figures and their provenance (command, commit, CPU, threads, load; ``trainer.experiments.provenance``), and
every block of ``DOCS`` that names that file is rewritten. A block is the text between
``<!-- BEGIN generated: docs/benchmarks/results/<name>.json -->`` and ``<!-- END generated -->`` (the markers
of docs/results.md), rendered by ``RENDERERS[name]``: a table and one line naming the command and the
provenance. An output ``<kind>-<variant>`` with no renderer of its own renders like ``<kind>`` (e.g.
``plan-measured-complementary`` like ``plan-measured``). ``stale_blocks`` lists each block that differs from
its output, names an output that does not exist, or has no renderer: the test suite runs it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # also imported by benchmarks run as plain scripts
from trainer.experiments.provenance import provenance  # noqa: E402  (light: torch only when writing)

RESULTS_DIR = "docs/benchmarks/results"
RESULTS = ROOT / RESULTS_DIR
DOCS_RELATIVE = "benchmarks/results"
"""The outputs' folder as a page of docs/ links to it."""
DOCS = ("docs/benchmarks.md", "docs/launches.md")
"""The docs whose generated blocks render benchmark outputs, relative to the repository root."""


# ---- writing an output ------------------------------------------------------------------------------


def output_path(name: str, root: Path = ROOT) -> Path:
    return root / RESULTS_DIR / f"{name}.json"


def command(argv: Sequence[str]) -> list[str]:
    """``argv`` as one would type it in the repository root: ``python benchmarks/x.py ...`` (a script's
    absolute path made relative, so that no machine's folders land in an output)."""
    script = Path(argv[0])
    if script.is_absolute() and script.is_relative_to(ROOT):
        script = script.relative_to(ROOT)
    return ["python", str(script), *argv[1:]] if script.suffix == ".py" else list(argv)


def write_output(name: str, figures: dict, argv: Sequence[str] | None = None, *, root: Path = ROOT) -> Path:
    """Write ``figures`` with their provenance to ``<root>/docs/benchmarks/results/<name>.json`` and refresh
    every block of ``DOCS`` (under ``root``) that renders it; returns the file's path."""
    path = output_path(name, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    output = {"name": name, "figures": figures, "provenance": provenance(command(argv or sys.argv))}
    path.write_text(json.dumps(output, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for doc in DOCS:
        refresh(root / doc, root)
    print(f"wrote {path}")
    return path


# ---- rendering ----------------------------------------------------------------------------------------


def cell(value: object) -> str:
    """A figure as a table cell: thousands separators, at most 3 decimals, '–' for a missing one; a text's
    pipes escaped and its line breaks shown as ⏎, so that it stays one cell."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return str(value).replace("|", "\\|").replace("\n", " ⏎ ")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def rows_table(figures: dict) -> str:
    """``figures["rows"]`` (a list of dicts) as a table, the columns in the order the rows name them."""
    columns = list(dict.fromkeys(key for row in figures["rows"] for key in row))
    return table(columns, [[row.get(key) for key in columns] for row in figures["rows"]])


def scalars_table(figures: dict) -> str:
    """Every single-valued figure as a row of 'figure | value' (lists and mappings stay in the JSON only)."""
    scalars = [(k, v) for k, v in figures.items() if not isinstance(v, list | dict)]
    return table(["figure", "value"], scalars)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def plan_table(figures: dict) -> str:
    """bench_plan: the plan's peak and step time against the measured ones, per config."""
    header = ["config", "settings", "plan peak GB", "measured peak GB", "plan / measured", "plan step s",
              "measured step s (median)", "plan / measured", "steps that trained", "πϕ trained",
              "plan of RAM", "exit"]  # fmt: skip
    rows = []
    for r in figures["rows"]:
        peak, step = r.get("measured_peak_gb"), r.get("measured_step_s")
        rows.append(
            [r["config"], r.get("settings"), r["plan_peak_gb"], peak, _ratio(r["plan_peak_gb"], peak),
             r["plan_step_s"], step, _ratio(r["plan_step_s"], step), r.get("steps_trained"),
             r.get("extractor_trained"), r.get("plan_of_ram"), r.get("exit", 0)]
        )  # fmt: skip
    return table(header, rows)


def presets_table(figures: dict) -> str:
    """plan_presets: each preset's peak per device as the launch plan gives it."""
    rows = []
    for p in figures["presets"]:
        peak = ", ".join(f"{gb:.1f} GB" + (f" ({method})" if method else "") for method, gb in p["peaks"])
        if p["nproc"] > 1:
            peak += f" on rank 0 (and ~{p['host_gb_per_rank']:.0f} GB of host memory a rank)"
        rows.append([f"`{p['preset']}`", p["for"], p["models"], peak])
    return table(["preset", "for", "models", "peak per device (plan)"], rows)


RENDERERS: dict[str, Callable[[dict], str]] = {
    "plan-presets": presets_table,
    "plan-vs-measured": rows_table,
    "plan-measured": plan_table,
    "plan-near-limit": plan_table,
    "load": scalars_table,
    "live-page": rows_table,
    "import-memory": scalars_table,
    "import-speed": scalars_table,
    "import-merge": scalars_table,
    "import-beside-training": scalars_table,
    "request-cost": rows_table,
    "engines": rows_table,
    "engine-costs": scalars_table,
    "bf16-route": rows_table,
    "prompt-sensitivity": rows_table,
    "extractor-sampling": rows_table,
    "rank-rollouts": rows_table,
    "search-and-ask-reach": rows_table,
}
"""Output name → its table. Every benchmark that calls ``write_output`` has one here."""


def renderer(name: str) -> Callable[[dict], str] | None:
    """The renderer of output ``name``, or of the longest registered ``<kind>`` that it extends."""
    kinds = [k for k in RENDERERS if name == k or name.startswith(k + "-")]
    return RENDERERS[max(kinds, key=len)] if kinds else None


def provenance_line(output: dict) -> str:
    p = output["provenance"]
    commit = p["commit"][:7] + (" with uncommitted changes" if p.get("uncommitted_changes") else "")
    return (
        f"Output of `{p['command']}` (commit {commit}; {p['cpu']}, {p['threads']} threads, load "
        f"{p['load_1min']}; {p['finished_at'][:10]}): "
        f"[{output['name']}.json]({DOCS_RELATIVE}/{output['name']}.json)."
    )


def render(output: dict) -> str:
    """A block's text: the output's table, a blank line and the provenance line."""
    table_of = renderer(output["name"])
    if table_of is None:
        raise KeyError(f"no renderer for output {output['name']!r}")
    return f"{table_of(output['figures'])}\n\n{provenance_line(output)}\n"


# ---- checking and refreshing the docs -------------------------------------------------------------------


def _expected(block_path: str, root: Path) -> tuple[str | None, str | None]:
    """(the block's text rendered from its output, None) or (None, why it cannot be rendered)."""
    path = root / block_path
    name = Path(block_path).stem
    if not block_path.startswith(RESULTS_DIR + "/") or renderer(name) is None:
        return None, f"no renderer for {block_path} (benchmarks/outputs.py RENDERERS)"
    if not path.exists():
        return None, f"{block_path}: no such output (run the benchmark that writes it)"
    return render(json.loads(path.read_text(encoding="utf-8"))), None


def blocks(doc: Path) -> dict[str, str]:
    """``doc``'s generated blocks: the path each names → its text (docs/results.md's markers)."""
    # imported here: the report's modules import torch, which a benchmark measuring memory imports itself
    from trainer.experiments.summary import readme_blocks

    return readme_blocks(doc)


def render_blocks(doc: Path, root: Path = ROOT) -> dict[str, str]:
    """Each generated block of ``doc`` that can be rendered → its text from the committed output."""
    out = {}
    for block_path in blocks(doc):
        text, _ = _expected(block_path, root)
        if text is not None:
            out[block_path] = text
    return out


def stale_blocks(doc: Path, root: Path = ROOT) -> list[str]:
    """Every difference between ``doc``'s generated blocks and their outputs, readably; empty: they hold."""
    problems = []
    for block_path, body in blocks(doc).items():
        text, why = _expected(block_path, root)
        if why:
            problems.append(f"{doc}: {why}")
        elif body != text:
            diff = difflib.unified_diff(body.splitlines(), text.splitlines(), "in the doc", "from the output",
                                        lineterm="", n=0)  # fmt: skip
            problems.append(f"{doc}: block {block_path} differs from its output:\n" + "\n".join(diff))
    return problems


def refresh(doc: Path, root: Path = ROOT) -> list[str]:
    """Rewrite each block of ``doc`` that renders from an output; returns the blocks rewritten."""
    from trainer.experiments.summary import include_summary  # see blocks

    if not doc.exists():
        return []
    rendered = render_blocks(doc, root)
    for block_path, text in rendered.items():
        include_summary(doc, block_path, text)
    return list(rendered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.outputs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=("refresh", "check"))
    args = parser.parse_args(argv)
    if args.action == "refresh":
        for doc in DOCS:
            print(f"{doc}: {len(refresh(ROOT / doc))} blocks refreshed")
    problems = [p for doc in DOCS for p in stale_blocks(ROOT / doc)]
    print("\n".join(problems) or "every generated block matches its output")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
