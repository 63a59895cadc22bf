"""The shape of the house's own code, measured on every run of the suite: no import circle anywhere in the
product's packages, placement asked about in one place, no function or hand-written module grown past what a
reader takes in at once (docs/design.md §8)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer", "webapp", "api", "experience")
MAX_FUNCTION_LINES = 60
"""For trainer/ and webapp/: a function longer than this is split into named phases."""
MAX_MODULE_LINES = 800
PLACEMENT_MODULES = {"trainer/parallel.py", "trainer/checkpoint.py"}
"""The only modules that ask whether a model is sharded: parallelism and the checkpointer."""


def _sources(packages: tuple[str, ...] = PACKAGES) -> Iterator[Path]:
    """The hand-written Python files of ``packages`` (Django's generated migrations left out)."""
    for package in packages:
        yield from (p for p in (REPO / package).rglob("*.py") if "migrations" not in p.parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The house modules a module imports, at the top or inside functions (either can close a circle)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the house modules it imports; a package's own ``__init__`` importing it is no circle."""
    paths = {_module_name(p): p for p in _sources()}
    graph = {}
    for name, path in paths.items():
        targets = _imported(ast.parse(path.read_text()), set(paths))
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def long_functions(packages: tuple[str, ...], limit: int) -> list[str]:
    out = []
    for path in _sources(packages):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_module_of_the_house_takes_part_in_an_import_circle():
    assert import_circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_only_parallelism_and_the_checkpointer_ask_whether_a_model_is_sharded():
    askers = {
        str(p.relative_to(REPO))
        for p in _sources()
        if "is_sharded(" in p.read_text() and str(p.relative_to(REPO)) not in PLACEMENT_MODULES
    }
    assert askers == set()


def test_no_function_in_the_trainer_or_the_web_app_is_longer_than_a_screen():
    assert long_functions(("trainer", "webapp"), MAX_FUNCTION_LINES) == []


def test_no_hand_written_module_is_longer_than_800_lines():
    long = [
        f"{p.relative_to(REPO)} ({n})" for p in _sources() if (n := len(p.read_text().splitlines())) > 800
    ]
    assert long == []
