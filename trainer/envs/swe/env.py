"""SWE-mini: fix an injected bug in a real Python project, graded by its tests as SWE-bench does.

An episode starts from an issue (``problem_statement``) and a private working copy of the project
with the bug in place. The agent reads and edits files through text actions, may run the tests,
and submits. Grading (on submit, or when the turn limit is reached) runs the instance's test
files in the sandbox with the test files restored to their pristine state: the instance is
resolved when every FAIL_TO_PASS and PASS_TO_PASS test passes. Reward 1 resolved, 0 otherwise.
"""

from __future__ import annotations

import posixpath
import random
import re
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from trainer.envs.base import StepInfo, TextEnv, register_env
from trainer.envs.swe.build import load_instances
from trainer.envs.swe.mutate import apply_patch, line_opcodes, patch_files, split_lines
from trainer.envs.swe.projects import ENV_NAME, PROJECTS, source_dir
from trainer.envs.swe.sandbox import TestRun, copy_repo, run_tests

READ_LINES = 100
"""Most lines one ``read`` shows."""
SEARCH_HITS = 20
VERBS = ("list", "read", "search", "replace", "run_tests", "submit")
_ACTION = re.compile(r"\b(list|read|search|replace|run_tests|submit)\[([^\]\n]*)\]")
_BLOCKS = re.compile(r"\A\s*<old>\n?(.*?)\n?</old>\s*<new>\n?(.*?)\n?</new>", re.DOTALL)


@dataclass(frozen=True)
class Action:
    verb: str
    arg: str = ""
    old: str = ""
    new: str = ""

    def text(self) -> str:
        if self.verb == "replace":
            return f"replace[{self.arg}]\n<old>\n{self.old}\n</old>\n<new>\n{self.new}\n</new>"
        return f"{self.verb}[{self.arg}]"


def parse(text: str) -> Action | None:
    """The first action in ``text``; words around it are ignored. A ``replace`` needs its
    ``<old>`` and ``<new>`` blocks right after it, else the text holds no valid action."""
    m = _ACTION.search(text)
    if m is None:
        return None
    verb, arg = m.group(1), m.group(2).strip()
    if verb in ("run_tests", "submit"):
        return Action(verb)
    if verb == "list":
        return Action(verb, arg or ".")
    if not arg:
        return None
    if verb == "replace":
        blocks = _BLOCKS.match(text[m.end() :])
        if blocks is None or not blocks.group(1).strip():
            return None
        return Action(verb, arg, blocks.group(1), blocks.group(2))
    return Action(verb, arg)


def _cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@register_env(ENV_NAME)
class SWEMiniEnv(TextEnv):
    name: ClassVar[str] = ENV_NAME
    max_turns: ClassVar[int] = 30
    action_syntax: ClassVar[str] = (
        "Write exactly one action per turn:\n"
        "  list[DIR]                 list a folder of the repository (list[.] for the top)\n"
        "  read[FILE] or read[FILE:START-END]   show numbered lines of a file (at most 100)\n"
        "  search[TEXT]              find TEXT in the repository's .py files\n"
        "  replace[FILE] then <old>, the exact lines to change, </old>, <new>, the new lines, </new>\n"
        "                            (the old text must occur exactly once; no line numbers)\n"
        "  run_tests[]               run the tests of the issue\n"
        "  submit[]                  finish; your fix is graded by the tests\n"
        "Example:\n"
        "replace[pkg/util.py]\n<old>\n    if n < 0:\n</old>\n<new>\n    if n <= 0:\n</new>"
    )
    instructions: ClassVar[str] = (
        "You fix a bug in a Python repository. Read the issue, find the faulty code with list, read "
        "and search, change it with replace, check with run_tests, then submit. Change library code "
        "only: test files are restored before grading."
    )

    def __init__(self, split: str = "train", subset: str = "all") -> None:
        super().__init__(split)
        self.instances = load_instances(split, subset)
        self.instance: dict[str, Any] = {}
        self.workspace: Path | None = None
        self.edited: set[str] = set()
        self.tested_since_edit = False
        self.last_score: TestRun | None = None

    def num_instances(self) -> int:
        return len(self.instances)

    # ---- episode ---------------------------------------------------------------------------
    def _reset(self, seed: int) -> tuple[str, StepInfo]:
        self.close()
        self.instance = inst = self.instances[seed % len(self.instances)]
        self.pristine = source_dir(PROJECTS[inst["repo"]])
        tmp = Path(tempfile.mkdtemp(prefix="swe-mini-ws-"))
        self._finalizer = weakref.finalize(self, _cleanup, tmp)
        self.workspace = tmp / "repo"
        copy_repo(self.pristine, self.workspace)
        gold_files = patch_files(inst["gold_patch"])
        clean = {f: self._read(self.pristine / f) for f in gold_files}
        for f, text in apply_patch(clean, inst["gold_patch"], reverse=True).items():
            (self.workspace / f).write_text(text)
        self.edited = set(gold_files)
        self.tested_since_edit = False
        self.last_score = None
        top = self._listing(".")
        obs = (
            f"Repository {inst['repo']} {inst['version']}. Issue:\n\n{inst['problem_statement']}\n\n"
            f"Top of the repository:\n{top}"
        )
        return obs, self._info()

    def _info(self, **extra: Any) -> StepInfo:
        extra = {"instance_id": self.instance.get("instance_id", "")} | extra
        return StepInfo(goal=self.instance.get("problem_statement", ""), extra=extra)

    def close(self) -> None:
        if self.workspace is not None:
            self._finalizer()
            self.workspace = None

    def parse_action(self, text: str) -> str | None:
        action = parse(text)
        return None if action is None else action.text()

    def _step(self, action_text: str) -> tuple[str, float, bool, StepInfo]:
        action = parse(action_text)
        assert action is not None and self.workspace is not None
        if action.verb == "submit":
            return self._grade("Submitted.")
        obs = getattr(self, f"_do_{action.verb}")(action)
        if self.turn >= self.max_turns:
            return self._grade(f"{obs}\nTurn limit of {self.max_turns} reached: your edits are graded now.")
        return obs, 0.0, False, self._info()

    def _invalid(self, action_text: str) -> tuple[str, float, bool, StepInfo]:
        obs, reward, done, info = super()._invalid(action_text)
        if self.turn >= self.max_turns:
            return self._grade(f"{obs}\nTurn limit of {self.max_turns} reached: your edits are graded now.")
        return obs, reward, done, info

    # ---- actions ---------------------------------------------------------------------------
    def _resolve(self, rel: str) -> tuple[str, Path] | None:
        """A path inside the workspace, or None (absolute, escaping or missing)."""
        norm = posixpath.normpath(rel.strip().strip("`'\""))
        if norm.startswith(("/", "..")) or "\\" in norm:
            return None
        path = self.workspace / norm
        return (norm, path) if path.exists() else None

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text(errors="replace")

    def _listing(self, rel: str) -> str:
        found = self._resolve(rel)
        if found is None or not found[1].is_dir():
            return ""
        entries = sorted(found[1].iterdir(), key=lambda p: (p.is_file(), p.name))
        names = [p.name + ("/" if p.is_dir() else "") for p in entries if p.name != "__pycache__"]
        return "  ".join(names)

    def _do_list(self, a: Action) -> str:
        listing = self._listing(a.arg)
        if not listing:
            return f"No folder {a.arg!r} in the repository. Try list[.]"
        return f"{a.arg}:\n{listing}"

    def _do_read(self, a: Action) -> str:
        m = re.fullmatch(r"(.+?)(?::(\d+)(?:-(\d+))?)?", a.arg)
        found = self._resolve(m.group(1))
        if found is None or not found[1].is_file():
            return f"No file {m.group(1)!r}. Use list[DIR] or search[TEXT] to find it."
        lines = self._read(found[1]).splitlines()
        start = max(int(m.group(2) or 1), 1)
        end = min(int(m.group(3) or start + READ_LINES - 1), start + READ_LINES - 1, len(lines))
        if start > len(lines):
            return f"{found[0]} has only {len(lines)} lines."
        body = "\n".join(f"{i:5d}| {lines[i - 1]}" for i in range(start, end + 1))
        more = (
            f"\n(lines {start}-{end} of {len(lines)}; read[{found[0]}:{end + 1}-{end + READ_LINES}] for more)"
        )
        return f"{found[0]}:\n{body}" + (more if end < len(lines) else "")

    def _do_search(self, a: Action) -> str:
        hits: list[str] = []
        total = 0
        for path in sorted(self.workspace.rglob("*.py")):
            rel = str(path.relative_to(self.workspace))
            for i, line in enumerate(self._read(path).splitlines(), 1):
                if a.arg in line:
                    total += 1
                    if len(hits) < SEARCH_HITS:
                        hits.append(f"{rel}:{i}: {line.strip()[:120]}")
        if not hits:
            return f"No match for {a.arg!r} in the .py files."
        more = f"\n({total - SEARCH_HITS} more matches not shown)" if total > SEARCH_HITS else ""
        return f"{total} match(es) for {a.arg!r}:\n" + "\n".join(hits) + more

    def _do_replace(self, a: Action) -> str:
        found = self._resolve(a.arg)
        if found is None or not found[1].is_file():
            return f"No file {a.arg!r}: nothing changed."
        rel, path = found
        text = self._read(path)
        count = text.count(a.old)
        if count != 1:
            why = "was not found" if count == 0 else f"occurs {count} times"
            hint = (
                "copy it exactly from read[...], without line numbers" if count == 0 else "include more lines"
            )
            return f"The old text {why} in {rel}: nothing changed ({hint})."
        at = text.index(a.old)
        new_text = text[:at] + a.new + text[at + len(a.old) :]
        path.write_text(new_text)
        self.edited.add(rel)
        self.tested_since_edit = False
        first = text.count("\n", 0, at) + 1
        last = first + a.new.count("\n")
        lines = new_text.splitlines()
        shown = "\n".join(
            f"{i:5d}| {lines[i - 1]}" for i in range(max(first - 2, 1), min(last + 2, len(lines)) + 1)
        )
        warning = ""
        if rel.endswith(".py"):
            try:
                compile(new_text, rel, "exec")
            except SyntaxError as e:
                warning = f"\nWarning: {rel} no longer parses: {e.msg} (line {e.lineno})."
        return f"Edited {rel}, lines {first}-{last} now read:\n{shown}{warning}"

    def _do_run_tests(self, a: Action) -> str:
        inst = self.instance
        run = run_tests(self.workspace, inst["test_files"], deselect=PROJECTS[inst["repo"]].deselect)
        self.tested_since_edit = True
        return _summary(run)

    def _grade(self, prefix: str) -> tuple[str, float, bool, StepInfo]:
        """Score as SWE-bench does: pristine test files; every FAIL_TO_PASS and PASS_TO_PASS must pass."""
        inst = self.instance
        tests = {f: self._read(self.pristine / f) for f in inst["test_files"]}
        run = run_tests(
            self.workspace, inst["test_files"], deselect=PROJECTS[inst["repo"]].deselect, overrides=tests
        )
        self.last_score = run
        f2p = sum(run.passed(t) for t in inst["FAIL_TO_PASS"])
        p2p = sum(run.passed(t) for t in inst["PASS_TO_PASS"])
        resolved = f2p == len(inst["FAIL_TO_PASS"]) and p2p == len(inst["PASS_TO_PASS"])
        verdict = "RESOLVED: every test of the issue passes." if resolved else "NOT RESOLVED."
        obs = (
            f"{prefix} {verdict} FAIL_TO_PASS {f2p}/{len(inst['FAIL_TO_PASS'])}, "
            f"PASS_TO_PASS {p2p}/{len(inst['PASS_TO_PASS'])}."
        )
        reward = self.success_reward if resolved else self.failure_reward
        info = self._info(resolved=resolved, fail_to_pass_passed=f2p, pass_to_pass_passed=p2p)
        info.success = resolved
        return obs, reward, True, info

    # ---- oracle ----------------------------------------------------------------------------
    def expert_action(self) -> str:
        """Undo every difference from the pristine source (the gold patch, and any other edit),
        one replace at a time; then run the tests once; then submit."""
        for rel in sorted(self.edited):
            current = self._read(self.workspace / rel)
            target = self._read(self.pristine / rel)
            if current != target:
                return _replace_towards(rel, current, target).text()
        return "submit[]" if self.tested_since_edit else "run_tests[]"


def _replace_towards(rel: str, current: str, target: str) -> Action:
    """A replace action that turns the first differing block of ``current`` into ``target``'s,
    with enough surrounding lines that its old text occurs exactly once."""
    cur, tgt = split_lines(current), split_lines(target)
    ops = line_opcodes(cur, tgt)
    _, i1, i2, j1, j2 = next(op for op in ops if op[0] != "equal")
    pad = 0
    while True:
        a, b = max(i1 - pad, 0), min(i2 + pad, len(cur))
        old = "".join(cur[a:b])
        if old.strip() and current.count(old.removesuffix("\n")) == 1 or (a == 0 and b == len(cur)):
            break
        pad += 1
    new = "".join(cur[a:i1] + tgt[j1:j2] + cur[i2:b])
    return Action("replace", rel, old.removesuffix("\n"), new.removesuffix("\n"))


def _summary(run: TestRun) -> str:
    counts = {
        k: sum(r.outcome == k for r in run.results.values()) for k in ("passed", "failed", "skipped", "error")
    }
    head = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests ran"
    lines = [f"Tests: {head}."]
    if run.timed_out:
        lines.append("The test run hit the time limit and was stopped.")
    for r in run.failed[:10]:
        msg = r.message.strip().splitlines()[0][:200] if r.message.strip() else ""
        lines.append(f"FAILED {r.nodeid}" + (f": {msg}" if msg else ""))
    if len(run.failed) > 10:
        lines.append(f"... and {len(run.failed) - 10} more failures")
    return "\n".join(lines)


def random_action(env: SWEMiniEnv, rng: random.Random) -> str:
    """A uniformly random valid action (the baseline that should almost never resolve)."""
    assert env.workspace is not None
    files = sorted(str(p.relative_to(env.workspace)) for p in env.workspace.rglob("*.py"))
    verb = rng.choice(VERBS)
    if verb == "list":
        dirs = sorted({posixpath.dirname(f) or "." for f in files})
        return f"list[{rng.choice(dirs)}]"
    path = rng.choice(files)
    lines = [ln for ln in env._read(env.workspace / path).splitlines() if ln.strip()]
    if verb == "read":
        start = rng.randint(1, max(len(lines), 1))
        return f"read[{path}:{start}-{start + 40}]"
    if verb == "search":
        words = re.findall(r"[A-Za-z_]\w{2,}", " ".join(lines)) or ["def"]
        return f"search[{rng.choice(words)}]"
    if verb == "replace" and len(lines) >= 2:
        old, new = rng.sample(lines, 2)
        return Action("replace", path, old, new).text()
    return f"{rng.choice(('run_tests', 'submit'))}[]"
