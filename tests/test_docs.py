"""The documentation: the MkDocs site builds with --strict (a broken link or a page left out fails), the
README stays short, and the API reference page is what the served schema says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from api import reference

REPO = Path(__file__).resolve().parent.parent


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
