"""The documentation: the MkDocs site builds with --strict (a broken link or a page left out fails), the
README stays short, the API reference page is what the served schema says, and the code's citations of the
design point at sections of docs/design.md, never at a file outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from api import reference

REPO = Path(__file__).resolve().parent.parent
CODE = ("trainer", "webapp", "api", "experience", "benchmarks", "scripts", "tests")
"""Where Python files may cite the design."""
OUTSIDE = re.compile(r"DESIGN(\.md| §)|STYLE(\.md| \")")
"""Citations of the reference notes that lived outside the repository (the design is docs/design.md)."""
CITATION = re.compile(r"docs/design\.md((?:,? ?§\d+(?:\.\d+)?)+)")
"""``docs/design.md §3.2`` or ``docs/design.md §3, §8``: the sections are in group 1."""


def _python_sources() -> dict[str, str]:
    files = [p for folder in CODE for p in (REPO / folder).rglob("*.py")]
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in files}


def _design_sections() -> set[str]:
    """The section numbers of docs/design.md's headings (``## 3. The method``, ``### 3.1 Actor``)."""
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", design, re.MULTILINE))


def test_the_documentation_site_builds_strictly_with_every_page_in_its_navigation(tmp_path):
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(
        build, cwd=REPO, capture_output=True, text=True, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "make run" in home and 'href="getting-started/"' in home
    results = (tmp_path / "site" / "results" / "index.html").read_text()
    # the generated blocks' repository-root links point into the site (docs/hooks.py)
    assert 'href="../experiments/room-random/report/report/"' in results
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_the_readme_is_short_and_links_only_to_files_that_exist():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    assert "make run" in readme and "make test" in readme
    for target in ("docs/index.md", "docs/results.md", "docs/api.md", "docs/img/run-page.png"):
        assert f"({target})" in readme or f"]({target}" in readme
        assert (REPO / target).exists()


def test_the_api_reference_page_lists_every_operation_of_the_schema(settings):
    schema = reference.current_schema()
    assert not reference.differs(REPO / "docs" / "api.md", schema), "run 'manage.py api_reference'"
    table = reference.operations_table(schema)
    assert table.count("\n") - 2 == sum(
        1 for item in schema["paths"].values() for method in item if method in reference.METHODS
    )


def test_a_stale_api_reference_is_caught(tmp_path, settings):
    page = tmp_path / "api.md"
    page.write_text(f"# API\n\n{reference.BEGIN}| a stale table |\n{reference.END}\n")
    schema = reference.current_schema()
    assert reference.differs(page, schema)
    reference.write(page, schema)
    assert not reference.differs(page, schema) and "/api/v1/runs" in page.read_text()


def test_no_python_file_cites_a_design_or_style_note_outside_the_repository():
    citing = [path for path, text in _python_sources().items() if OUTSIDE.search(text)]
    assert citing == [], "cite docs/design.md §N instead"


def test_every_section_of_the_design_that_the_code_cites_exists():
    sections = _design_sections()
    assert {"1", "2", "3", "3.1", "3.2", "3.3", "3.4", "3.5", "4", "5", "6", "7", "8"} <= sections
    cited = {
        (path, number)
        for path, text in _python_sources().items()
        for numbers in CITATION.findall(text)
        for number in re.findall(r"§(\d+(?:\.\d+)?)", numbers)
    }
    assert cited and {(path, n) for path, n in cited if n not in sections} == set()
