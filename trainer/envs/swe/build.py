"""Build the SWE-mini instance set: inject bugs into pinned projects, keep the ones tests catch.

For each project, every mutation site inside a tested module is a candidate (see ``mutate.py``);
candidates are tried in a seeded order, round-robin over modules, each in the sandbox against
the module's test files. A mutant becomes an instance when at least one test that passes on the
pristine source fails (FAIL_TO_PASS), nothing else breaks the run (collection error, outer
timeout), and the gold patch (the reverse edit as a unified diff) gives back the pristine file
exactly, on which all those tests pass (the baseline run). PASS_TO_PASS is every other test of
those files that passes both before and after.

    python -m trainer.envs.swe.build           # train instances into the cache; eval sources
    python -m trainer.envs.swe.build --freeze  # maintainers: rewrite the committed split files
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from trainer.envs.splits import load_split, split_path, write_split
from trainer.envs.swe.mutate import Mutation, apply_patch, find_mutations, is_real_change, make_patch
from trainer.envs.swe.projects import ENV_NAME, PROJECTS, Project, module_files, source_dir
from trainer.envs.swe.sandbox import TestRun, run_tests
from trainer.paths import cache_dir

TINY_SPLIT = "SWE-mini-tiny"
BUILD_VERSION = 1
MAX_FAIL_TO_PASS = 25
"""Mutants that break more tests than this make vague issues; they are dropped."""
MAX_RUN_SECONDS = 20.0
"""Mutants whose test run takes longer (e.g. an infinite loop in many tests) are dropped."""
MAX_PER_FUNCTION = 2


def train_cache_path() -> Path:
    return cache_dir("swe") / f"instances.train.v{BUILD_VERSION}.json"


class _Caught(NamedTuple):
    """A mutant the tests catch: the run on it, which tests it breaks and keeps, and the fix."""

    run: TestRun
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    gold_patch: str


def build_project(project: Project, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The instances of one project, in a fixed order (same code, same source -> same set)."""
    tree = source_dir(project)
    modules = module_files(project, tree)
    baseline = {mod: _run(project, tree, tests) for mod, tests in modules.items()}
    passing = {
        mod: sorted(t for t, r in run.results.items() if r.outcome == "passed")
        for mod, run in baseline.items()
    }
    instances: list[dict[str, Any]] = []
    per_function: Counter[tuple[str, str]] = Counter()
    tried = 0
    for mod, mutation in _round_robin(_mutation_queues(project, tree, modules)):
        if len(instances) >= project.target:
            break
        if per_function[(mod, mutation.function)] >= MAX_PER_FUNCTION or not passing[mod]:
            continue
        source = (tree / mod).read_text()
        buggy = mutation.apply(source)
        if not is_real_change(source, buggy):
            continue
        tried += 1
        if tried % 25 == 0:
            log(f"{project.name}: {tried} mutants tried, {len(instances)} kept")
        caught = _catch(project, tree, modules[mod], passing[mod], mod, source, buggy)
        if caught is None:
            continue
        per_function[(mod, mutation.function)] += 1
        instance_id = f"{project.name}-{len(instances):04d}"
        instances.append(_instance(project, tree, instance_id, mod, mutation, caught, modules[mod]))
    log(f"{project.name}: {len(instances)} instances from {tried} mutants tried ({len(modules)} modules)")
    return instances


def _mutation_queues(
    project: Project, tree: Path, modules: dict[str, list[str]]
) -> dict[str, list[Mutation]]:
    """Each module's mutation sites in an order seeded by the project's name and version."""
    rng = random.Random(f"swe-mini:{project.name}:{project.version}")
    queues = {}
    for mod in modules:
        sites = find_mutations((tree / mod).read_text())
        rng.shuffle(sites)
        queues[mod] = sites
    return queues


def _catch(
    project: Project, tree: Path, tests: list[str], passing: list[str], mod: str, source: str, buggy: str
) -> _Caught | None:
    """Run the module's tests on the mutant; None unless it makes a clear, fixable instance: a clean,
    quick run, 1..MAX_FAIL_TO_PASS broken tests, and a gold patch that gives the pristine file back."""
    run = _run(project, tree, tests, overrides={mod: buggy})
    fail_to_pass = [t for t in passing if not run.passed(t)]
    pass_to_pass = [t for t in passing if run.passed(t)]
    if run.timed_out or run.collection_errors or run.seconds > MAX_RUN_SECONDS:
        return None
    if not 1 <= len(fail_to_pass) <= MAX_FAIL_TO_PASS:
        return None
    gold_patch = make_patch(mod, buggy, source)
    if apply_patch({mod: buggy}, gold_patch)[mod] != source:
        return None
    return _Caught(run, fail_to_pass, pass_to_pass, gold_patch)


def _instance(
    project: Project,
    tree: Path,
    instance_id: str,
    mod: str,
    mutation: Mutation,
    caught: _Caught,
    test_files: list[str],
) -> dict[str, Any]:
    return {
        "instance_id": instance_id,
        "repo": project.repo,
        "version": project.version,
        "base_commit": project.base_commit,
        "split": project.split,
        "problem_statement": problem_statement(project, tree, mod, mutation, caught.run, caught.fail_to_pass),
        "FAIL_TO_PASS": caught.fail_to_pass,
        "PASS_TO_PASS": caught.pass_to_pass,
        "gold_patch": caught.gold_patch,
        "test_files": test_files,
        "bug": {"kind": mutation.kind, "file": mod, "function": mutation.function, "line": mutation.lineno},
    }


def _run(project: Project, tree: Path, tests: list[str], overrides: dict[str, str] | None = None) -> TestRun:
    return run_tests(tree, tests, deselect=project.deselect, overrides=overrides)


def _round_robin(queues: dict[str, list[Mutation]]) -> Iterable[tuple[str, Mutation]]:
    longest = max((len(q) for q in queues.values()), default=0)
    for i in range(longest):
        for mod, q in queues.items():
            if i < len(q):
                yield mod, q[i]


def problem_statement(
    project: Project, tree: Path, mod: str, mutation: Mutation, run: TestRun, fail_to_pass: list[str]
) -> str:
    """An issue as a user would write it: which function misbehaves, an example, what happens.

    Derived from the first failing test; it never shows the patch or the mutated line.
    """
    dotted = mod.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    func = f"{dotted}.{mutation.function}"
    first = run.results[fail_to_pass[0]]
    test_file = fail_to_pass[0].split("::")[0]
    example = _statement_at(tree / test_file, first.test_lineno)
    message = "\n".join(first.message.strip().splitlines()[:12])[:700] or "(no message)"
    parts = [
        f"`{func}` misbehaves",
        "",
        f"In {project.repo} {project.version}, `{mutation.function}` (in `{mod}`) does not do what its "
        "documentation and tests say.",
    ]
    if example:
        parts += ["For example, this check from the test suite:", "", textwrap.indent(example, "    "), ""]
        parts += ["fails with:"]
    else:
        parts += [f"Running `{fail_to_pass[0]}` fails with:"]
    parts += ["", textwrap.indent(message, "    "), ""]
    shown = ", ".join(f"`{t}`" for t in fail_to_pass[:3]) + (" ..." if len(fail_to_pass) > 3 else "")
    parts += [
        f"Failing tests ({len(fail_to_pass)}): {shown}",
        "",
        "Expected: these tests pass. Fix the library code; do not change the tests.",
    ]
    return "\n".join(parts)


def _statement_at(path: Path, lineno: int) -> str:
    """The smallest statement of ``path`` that covers line ``lineno`` (at most 8 lines)."""
    if lineno <= 0:
        return ""
    source = path.read_text()
    best: ast.stmt | None = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
            if best is None or (node.end_lineno - node.lineno) < (best.end_lineno - best.lineno):
                best = node
    if best is None or isinstance(best, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return source.splitlines()[lineno - 1].strip()
    text = textwrap.dedent(" " * best.col_offset + (ast.get_source_segment(source, best) or ""))
    lines = text.splitlines()
    return "\n".join(lines[:8] + (["..."] if len(lines) > 8 else []))


# ---- the instance sets ---------------------------------------------------------------------------
def load_instances(split: str, subset: str = "all") -> list[dict[str, Any]]:
    """The instances of ``split``. ``subset``: ``all``, ``tiny`` (the hand-written repos only, train)
    or a project name."""
    if split == "eval":
        instances = load_split(split_path(ENV_NAME))
    else:
        tiny = load_split(split_path(TINY_SPLIT, "train"))
        if subset == "tiny" or subset in {i["repo"] for i in tiny}:
            instances = tiny
        else:
            instances = tiny + _train_instances()
    if subset not in ("all", "tiny"):
        instances = [i for i in instances if i["repo"] == subset]
    if not instances:
        raise ValueError(f"SWE-mini: no {split} instances for subset {subset!r}")
    return instances


def _train_instances() -> list[dict[str, Any]]:
    path = train_cache_path()
    if not path.exists():
        build_train()
    return json.loads(path.read_text())


def build_train(log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Build the train instances of the real projects into the cache (minutes, needs PyPI once)."""
    instances = [
        inst for p in PROJECTS.values() if p.split == "train" and not p.tiny for inst in build_project(p, log)
    ]
    path = train_cache_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(instances, indent=1))
    tmp.replace(path)
    return instances


def prepare(log: Callable[[str], None] = print, *, train: bool = True) -> None:
    """Eval sources downloaded and checked; with ``train``, the train instances built (minutes)."""
    start = time.perf_counter()
    for p in PROJECTS.values():
        source_dir(p)
    for inst in load_instances("eval"):
        tree = source_dir(PROJECTS[inst["repo"]])
        _check_gold(tree, inst)
    log(f"eval split: {len(load_instances('eval'))} instances, sources ready")
    if not train:
        return
    if not train_cache_path().exists():
        build_train(log)
    counts = Counter(i["repo"] for i in load_instances("train"))
    log(f"train: {sum(counts.values())} instances {dict(counts)}; {time.perf_counter() - start:.0f} s")


def _check_gold(tree: Path, inst: dict[str, Any]) -> None:
    """The instance's bug applies to this source, and its gold patch gives the source back."""
    files = {f: (tree / f).read_text() for f in _patched_files(inst)}
    buggy = apply_patch(files, inst["gold_patch"], reverse=True)
    if apply_patch(buggy, inst["gold_patch"]) != files:
        raise RuntimeError(f"{inst['instance_id']}: the gold patch does not round-trip on {tree}")


def _patched_files(inst: dict[str, Any]) -> list[str]:
    return [line[6:].strip() for line in inst["gold_patch"].splitlines() if line.startswith("+++ b/")]


def freeze(log: Callable[[str], None] = print) -> None:
    """Rebuild and rewrite the committed splits (eval: boltons; tiny train repos). Maintainers only."""
    for name, split, projects in (
        (ENV_NAME, "eval", [p for p in PROJECTS.values() if p.split == "eval"]),
        (TINY_SPLIT, "train", [p for p in PROJECTS.values() if p.tiny]),
    ):
        instances = [inst for p in projects for inst in build_project(p, log)]
        digest = write_split(split_path(name, split), instances)
        log(f"wrote {split_path(name, split)} ({len(instances)} instances, sha256 {digest[:12]})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--freeze", action="store_true", help="rewrite the committed eval and tiny splits")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached train instances")
    parser.add_argument(
        "--sources-only", action="store_true", help="only download and check the sources (what tests need)"
    )
    args = parser.parse_args(argv)
    if args.freeze:
        freeze()
        return
    if args.rebuild:
        train_cache_path().unlink(missing_ok=True)
    prepare(train=not args.sources_only)


if __name__ == "__main__":
    main()
