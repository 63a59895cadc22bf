"""Re-check SWE-mini instances as SWE-bench validates its own: through the env's grading, in the sandbox.

For each instance, two graded episodes of the env itself (``SWEMiniEnv``: reset, then ``submit[]``,
whose grading runs the instance's test files in the sandbox with pristine test files):

- at the mutant (the workspace as ``reset`` leaves it), every FAIL_TO_PASS test fails and every
  PASS_TO_PASS test passes;
- with the gold patch applied to the workspace (which must give the pristine files back), every
  FAIL_TO_PASS and PASS_TO_PASS test passes: the episode is resolved.

    python -m trainer.envs.swe.check                   # every eval instance and every train one
    python -m trainer.envs.swe.check --split eval      # the frozen eval split only
    python -m trainer.envs.swe.check --sample 5        # 5 instances per split, drawn with --seed

The train split includes the real projects' instances, built into the cache on first use (minutes).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainer.envs import make_env
from trainer.envs.swe.env import SWEMiniEnv
from trainer.envs.swe.mutate import apply_patch, patch_files


@dataclass
class InstanceCheck:
    instance_id: str
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _submit(env: SWEMiniEnv) -> dict:
    _, _, done, info = env.step("submit[]")
    assert done and env.last_score is not None
    return info


def _listed(tests: list[str]) -> str:
    return ", ".join(tests[:5]) + (f" and {len(tests) - 5} more" if len(tests) > 5 else "")


def check_instance(env: SWEMiniEnv, index: int) -> InstanceCheck:
    """Grade instance ``index`` of ``env`` at the mutant and with the gold patch (see the module doc)."""
    start = time.perf_counter()
    env.reset(index)
    inst = env.instance
    check = InstanceCheck(inst["instance_id"])
    f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]

    info = _submit(env)
    run = env.last_score
    if passing := [t for t in f2p if run.passed(t)]:
        check.problems.append(f"FAIL_TO_PASS passing at the mutant: {_listed(passing)}")
    if failing := [t for t in p2p if not run.passed(t)]:
        check.problems.append(f"PASS_TO_PASS not passing at the mutant: {_listed(failing)}")
    if info["resolved"]:
        check.problems.append("the mutant is graded as resolved")

    env.reset(index)
    files = {f: (env.workspace / f).read_text() for f in patch_files(inst["gold_patch"])}
    for rel, text in apply_patch(files, inst["gold_patch"]).items():
        if text != (env.pristine / rel).read_text():
            check.problems.append(f"the gold patch does not give back the pristine {rel}")
        (env.workspace / rel).write_text(text)
    info = _submit(env)
    run = env.last_score
    if failing := [t for t in f2p + p2p if not run.passed(t)]:
        check.problems.append(f"not passing with the gold patch: {_listed(failing)}")
    if not info["resolved"]:
        check.problems.append("the gold patch is not graded as resolved")
    check.seconds = time.perf_counter() - start
    return check


def check_split(
    split: str,
    subset: str = "all",
    sample: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[InstanceCheck]:
    """Check every instance of ``split`` (or ``sample`` of them, drawn with ``seed``)."""
    env: SWEMiniEnv = make_env("SWE-mini", split, subset=subset)  # type: ignore[assignment]
    indices = list(range(env.num_instances()))
    if sample is not None and sample < len(indices):
        indices = sorted(random.Random(f"{split}:{subset}:{seed}").sample(indices, sample))
    checks = []
    try:
        for index in indices:
            check = check_instance(env, index)
            checks.append(check)
            mark = "ok" if check.ok else "PROBLEM: " + "; ".join(check.problems)
            log(f"{split} {check.instance_id}: {mark} ({check.seconds:.1f} s)")
    finally:
        env.close()
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.envs.swe.check",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--split", choices=("eval", "train"), action="append", help="default: both")
    parser.add_argument("--subset", default="all", help="all, tiny (train) or a project name")
    parser.add_argument("--sample", type=int, help="check only this many instances per split")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bad = 0
    for split in args.split or ["eval", "train"]:
        checks = check_split(split, args.subset, args.sample, args.seed)
        failed = [c.instance_id for c in checks if not c.ok]
        bad += len(failed)
        print(
            f"{split}: {len(checks) - len(failed)}/{len(checks)} instances check out"
            + (f"; problems: {', '.join(failed)}" if failed else "")
        )
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
