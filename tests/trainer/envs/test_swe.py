"""SWE-mini: the tiny hand-written repos for most checks, one real (boltons) eval instance."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from trainer.envs import make_env
from trainer.envs.splits import SplitChecksumError, load_split, split_path
from trainer.envs.swe.build import TINY_SPLIT, build_project, load_instances
from trainer.envs.swe.check import check_instance, check_split
from trainer.envs.swe.env import SWEMiniEnv, parse, random_action
from trainer.envs.swe.mutate import apply_patch, find_mutations, make_patch
from trainer.envs.swe.projects import PROJECTS
from trainer.envs.swe.sandbox import run_tests


@pytest.fixture
def tiny() -> SWEMiniEnv:
    env = make_env("SWE-mini", "train", subset="tiny")
    yield env
    env.close()


def test_it_registers_and_states_its_protocol(tiny: SWEMiniEnv) -> None:
    assert tiny.max_turns == 30
    assert "replace[" in tiny.action_syntax and "submit[]" in tiny.action_syntax
    assert tiny.instructions
    assert tiny.num_instances() >= 10


def test_train_and_eval_come_from_different_projects() -> None:
    eval_repos = {i["repo"] for i in load_instances("eval")}
    train_projects = {p.name for p in PROJECTS.values() if p.split == "train"}
    assert eval_repos == {"boltons"}
    assert not eval_repos & train_projects
    assert len(load_instances("eval")) >= 50


def test_eval_split_is_frozen_with_a_checksum(tmp_path: Path) -> None:
    src = split_path("SWE-mini")
    copy = tmp_path / src.name
    shutil.copy(src, copy)
    shutil.copy(src.with_suffix(".sha256"), copy.with_suffix(".sha256"))
    instances = load_split(copy)
    keys = {
        "instance_id",
        "repo",
        "problem_statement",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "gold_patch",
        "base_commit",
    }
    assert all(keys <= set(i) and i["FAIL_TO_PASS"] for i in instances)
    copy.write_text(copy.read_text().replace("boltons", "bolts", 1))
    with pytest.raises(SplitChecksumError):
        load_split(copy)


def test_expert_resolves_tiny_instances(tiny: SWEMiniEnv) -> None:
    for seed in (0, 5, 11):
        actions = tiny.expert(seed)
        assert [a.split("[")[0] for a in actions] == ["replace", "run_tests", "submit"]
        assert tiny.last_score is not None
        obs = tiny.step  # the episode is over: step() must refuse
        with pytest.raises(RuntimeError):
            obs("submit[]")


def test_expert_reward_and_success_on_a_tiny_instance(tiny: SWEMiniEnv) -> None:
    tiny.reset(2)
    reward, done, info = 0.0, False, {}
    while not done:
        _, reward, done, info = tiny.step(tiny.expert_action())
    assert reward == 1.0 and info["success"] and info["resolved"]


def test_expert_resolves_a_real_project_instance() -> None:
    env = make_env("SWE-mini", "eval")
    try:
        obs, info = env.reset(0)
        assert "boltons" in obs and info["goal"] in obs
        done = False
        while not done:
            obs, reward, done, info = env.step(env.expert_action())
        assert reward == 1.0 and info["success"], obs
    finally:
        env.close()


def test_submitting_the_bug_unfixed_is_not_resolved(tiny: SWEMiniEnv) -> None:
    tiny.reset(1)
    obs, reward, done, info = tiny.step("ok, submit[]")
    assert done and reward == 0.0 and not info["success"]
    assert "NOT RESOLVED" in obs


def test_random_valid_actions_do_not_resolve(tiny: SWEMiniEnv) -> None:
    rng = random.Random(0)
    wins = 0
    for seed in range(3):
        tiny.reset(seed)
        done, info = False, {}
        while not done:
            _, _, done, info = tiny.step(random_action(tiny, rng))
            assert not info["invalid_action"]
        wins += info["success"]
    assert wins == 0


def test_unparseable_text_is_an_invalid_action_and_the_episode_goes_on(tiny: SWEMiniEnv) -> None:
    tiny.reset(0)
    for text in ("I think the bug is in clamp", "replace[tinymath/__init__.py] but no blocks", "read[]"):
        obs, reward, done, info = tiny.step(text)
        assert info["invalid_action"] and not done and reward == 0.0
        assert obs.startswith("Invalid action") and "run_tests[]" in obs


def test_actions_are_found_among_words_and_executed_strictly(tiny: SWEMiniEnv) -> None:
    assert parse("Let me look: read[a/b.py:3-9] and then more") == parse("read[a/b.py:3-9]")
    block = "Fix it:\nreplace[f.py]\n<old>\n    x = 1\n</old>\n<new>\n    x = 2\n</new>\nthanks"
    action = parse(block)
    assert (action.verb, action.arg, action.old, action.new) == ("replace", "f.py", "    x = 1", "    x = 2")
    obs, _ = tiny.reset(0)
    path = next(f for f in tiny.edited)
    obs, *_ = tiny.step(f"read[{path}:1-3]")
    assert obs.splitlines()[1].startswith("    1| ")
    obs, _, _, info = tiny.step("read[../../../etc/passwd]")
    assert obs.startswith("No file") and not info["invalid_action"]
    before = (tiny.workspace / path).read_text()
    obs, *_ = tiny.step(f"replace[{path}]\n<old>\nthis text is not there\n</old>\n<new>\nx\n</new>")
    assert "was not found" in obs and (tiny.workspace / path).read_text() == before
    obs, *_ = tiny.step(f"replace[{path}]\n<old>\n{before.splitlines()[0]}\n</old>\n<new>\n# edited\n</new>")
    assert obs.startswith("Edited") and (tiny.workspace / path).read_text().startswith("# edited\n")
    obs, *_ = tiny.step("search[def ]")
    assert "match(es)" in obs


def test_same_seed_same_episode(tiny: SWEMiniEnv) -> None:
    first = tiny.reset(4)
    tiny.step("list[.]")
    again = tiny.reset(4)
    assert first == again
    assert tiny.reset(5)[0] != first[0]


def test_turn_limit_ends_the_episode_and_grades_the_edits(tiny: SWEMiniEnv, monkeypatch) -> None:
    monkeypatch.setattr(tiny, "max_turns", 3)
    tiny.reset(3)
    tiny.step(tiny.expert_action())  # the fix
    tiny.step("list[.]")
    obs, reward, done, info = tiny.step("no action here")
    assert done and reward == 1.0 and info["resolved"] and "Turn limit" in obs
    tiny.reset(3)
    for _ in range(3):
        obs, reward, done, info = tiny.step("list[.]")
    assert done and reward == 0.0 and not info["success"]


def test_test_files_are_restored_before_grading(tiny: SWEMiniEnv) -> None:
    tiny.reset(0)
    test_file = tiny.instance["test_files"][0]
    text = (tiny.workspace / test_file).read_text()
    stub = "\n".join(line if not line.startswith("    assert") else "    pass" for line in text.splitlines())
    (tiny.workspace / test_file).write_text(stub + "\n")  # what a cheating agent would do
    obs, reward, *_ = tiny.step("submit[]")
    assert reward == 0.0


def test_workspace_is_discarded_on_reset_and_close(tiny: SWEMiniEnv) -> None:
    tiny.reset(0)
    first = tiny.workspace
    tiny.reset(1)
    assert not first.exists() and tiny.workspace.exists()
    second = tiny.workspace
    tiny.close()
    assert not second.exists()


def _repo(tmp_path: Path, test_body: str, module: str = "") -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "mod.py").write_text(module)
    (tmp_path / "tests" / "test_it.py").write_text(test_body)
    return tmp_path


def test_sandbox_stops_infinite_loops_and_has_no_network(tmp_path: Path) -> None:
    body = (
        "import socket\n\n"
        "def test_loop():\n    while True:\n        pass\n\n"
        "def test_net():\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n\n"
        "def test_memory():\n    b = bytearray(3 * 1024**3)\n\n"
        "def test_ok():\n    assert 1 + 1 == 2\n"
    )
    run = run_tests(_repo(tmp_path, body), ["tests"], per_test_timeout=1)
    outcome = {k.split("::")[-1]: r.outcome for k, r in run.results.items()}
    assert outcome == {
        "test_loop": "failed",
        "test_net": "failed",
        "test_memory": "failed",
        "test_ok": "passed",
    }
    assert "Timeout" in run.results["tests/test_it.py::test_loop"].message
    assert not (tmp_path / ".pytest_cache").exists()


def test_sandbox_outer_timeout_kills_a_hanging_import(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "import mod\n\ndef test_a():\n    pass\n", module="while True:\n    pass\n")
    run = run_tests(repo, ["tests"], outer_timeout=3)
    assert run.timed_out and not run.passed("tests/test_it.py::test_a")
    assert run.seconds < 10


def test_builder_reproduces_the_committed_tiny_instances() -> None:
    committed = [i for i in load_split(split_path(TINY_SPLIT, "train")) if i["repo"] == "tinytext"]
    assert build_project(PROJECTS["tinytext"], log=lambda _: None) == committed


def test_gold_patches_round_trip_and_statements_do_not_show_them() -> None:
    for inst in load_instances("eval") + load_instances("train", "tiny"):
        fixed = [
            ln[1:].strip() for ln in inst["gold_patch"].splitlines() if ln.startswith("+") and ln[1:].strip()
        ]
        assert fixed and not any(line in inst["problem_statement"] for line in fixed if len(line) > 12)
    source = "def f(a, b):\n    if a < b and not a:\n        return g(a, b) + 1\n    return 0\n"
    kinds = {m.kind for m in find_mutations(source)}
    assert kinds >= {"flipped comparison", "wrong boolean operator", "dropped negation", "swapped arguments"}
    for m in find_mutations(source):
        buggy = m.apply(source)
        patch = make_patch("f.py", buggy, source)
        assert apply_patch({"f.py": buggy}, patch) == {"f.py": source}


# ---- the instance sets re-checked through the env's grading ----------------------------------------
@pytest.mark.parametrize(("split", "subset", "sample"), [("eval", "all", 2), ("train", "tiny", 2)])
def test_sampled_instances_fail_at_the_mutant_and_pass_with_the_gold_patch(split, subset, sample) -> None:
    """A sample in CI; ``python -m trainer.envs.swe.check`` checks every instance of both splits."""
    checks = check_split(split, subset, sample=sample, log=lambda _: None)
    assert len(checks) == sample
    assert [c.problems for c in checks] == [[] for _ in checks]


def test_the_check_reports_an_instance_whose_test_lists_are_wrong(tiny: SWEMiniEnv) -> None:
    inst = tiny.instances[0]
    assert inst["PASS_TO_PASS"]
    # A passing test claimed to fail at the mutant, and a failing one claimed to pass.
    tiny.instances = [
        inst | {"FAIL_TO_PASS": inst["PASS_TO_PASS"][:1], "PASS_TO_PASS": inst["FAIL_TO_PASS"][:1]}
    ]
    problems = check_instance(tiny, 0).problems
    assert any("FAIL_TO_PASS passing at the mutant" in p for p in problems)
    assert any("PASS_TO_PASS not passing at the mutant" in p for p in problems)
    assert not any("gold patch" in p for p in problems)
