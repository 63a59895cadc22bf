"""One actor step of ``complementary`` on the paper's task mixtures: its time and memory on this machine.

    python benchmarks/bench_mixture_step.py [--mixtures 3-task,6-task] [--steps 3] [--k 8] [--tasks N]

Each mixture trains in a process of its own (so that its peak memory is its own) through the same code path
as ``manage.py train``: the ``cpu`` preset (SmolLM2-135M actor and extractor on two in-process vLLM
engines, 8 turns of at most 48 tokens), ``complementary``, the real bank (PostgreSQL + pgvector, a
throwaway database), as many task instances per step as the mixture has envs (sampled by weight, so a step
need not hold every env) × K rollouts, retrieval from step 1 (no warm-up), one eval episode per env at the
start and the end. Step 1 warms up and is left out; the figures are the median over the next ``--steps``:
wall seconds of the actor's step (rollout, actor update, sync), CPU seconds the process used in that step
(the extractor's background thread included: on a loaded machine the steadier figure), and the peak
resident memory during the step; then the process's peak over the whole run. Figures depend on the
machine's load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from throwaway_db import throwaway_database  # noqa: E402  (beside this script)

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class StepProbe:
    """A reporter that times each step and samples resident memory (every 0.1 s) between reports."""

    def __init__(self) -> None:
        from trainer.report import BaseReporter

        self.base = BaseReporter()
        self.rows: dict[int, dict[str, float]] = {}
        self._peak = 0
        self._mark = (time.perf_counter(), self._cpu())
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    @staticmethod
    def _cpu() -> float:
        t = os.times()
        return t.user + t.system

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self._peak = max(self._peak, rss_bytes())

    def _restart(self) -> tuple[float, float, int]:
        wall, cpu = self._mark
        peak, self._peak = max(self._peak, rss_bytes()), 0
        self._mark = (time.perf_counter(), self._cpu())
        return time.perf_counter() - wall, self._cpu() - cpu, peak

    def on_step(self, step, metrics):
        if step in self.rows:  # the last step reported again once the extractor's track has drained
            self.rows[step]["final"] = dict(metrics)
            return
        _, cpu, peak = self._restart()
        self.rows[step] = {"metrics": dict(metrics), "cpu_s": cpu, "peak_gib": peak / 2**30}

    def on_eval(self, step, metrics):
        self._restart()

    def __getattr__(self, name):
        return getattr(self.base, name)

    def close(self) -> None:
        self._stop.set()


def run_mixture(args: argparse.Namespace, mixture: str) -> None:
    with throwaway_database("bench_studio_mixture"):
        train_and_report(args, mixture)


def train_and_report(args: argparse.Namespace, mixture: str) -> None:
    from django.contrib.auth.models import User

    from trainer.assemble import train
    from trainer.config import get_preset
    from trainer.envs import make_mixture
    from trainer.models import default_model_path, prepare_default_models
    from webapp.models import Run
    from webapp.training import experience_store

    prepare_default_models(default_model_path())
    envs = make_mixture(mixture).names
    cfg = get_preset("cpu").with_overrides(
        **{
            "env": mixture,
            "method": "complementary",
            "steps": args.steps + 1,
            "tasks_per_step": args.tasks or len(envs),
            "k_rollouts": args.k,
            "eval_every": 0,
            "eval_episodes": 1,
            "checkpoint_every": 0,
            "checkpoint_keep": 1,
            "experience.warmup_steps": 0,
        }
    )
    user, _ = User.objects.get_or_create(username="bench")
    run = Run.objects.create(name=f"bench {mixture}", owner=user, method=cfg.method, env=mixture)
    probe = StepProbe()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out, experience_store(run, cfg) as store:
        train(cfg, out_dir=Path(out), reporter=probe, store=store)
    total = time.perf_counter() - t0
    probe.close()
    report(mixture, cfg, probe.rows, total)


def report(mixture: str, cfg, rows: dict[int, dict], total_s: float) -> None:
    measured = [rows[s] for s in sorted(rows) if s > 1]

    def med(get) -> float:
        return statistics.median(get(r) for r in measured)

    m = lambda key: med(lambda r: r["metrics"].get(key, 0.0))  # noqa: E731
    last = rows[max(rows)].get("final", rows[max(rows)]["metrics"])
    peak_process = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(
        f"| {mixture} | {cfg.tasks_per_step} × {cfg.k_rollouts} | {m('time/step_s'):.0f} "
        f"| {m('time/rollout_s'):.0f} | {m('time/backward_s') + m('time/recompute_s'):.0f} "
        f"| {med(lambda r: r['cpu_s']):.0f} | {med(lambda r: r['peak_gib']):.1f} | {peak_process:.1f} "
        f"| {last.get('extractor/distilled', 0):.0f} | {last.get('bank/size', 0):.0f} | {total_s:.0f} |",
        flush=True,
    )


HEADER = (
    "| mixture | tasks × K | step s | rollout s | actor update s | CPU s | peak RSS in step GiB "
    "| process peak GiB | distilled | bank size | whole run s |\n" + "|---" * 11 + "|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixtures", default="3-task,6-task")
    parser.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up step)")
    parser.add_argument("--k", type=int, default=8, help="rollouts per task instance")
    parser.add_argument("--tasks", type=int, default=0, help="task instances per step (0: one per env)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    mixtures = args.mixtures.split(",")
    if args.child:
        run_mixture(args, mixtures[0])
        return
    print(f"median of {args.steps} steps after a warm-up step; load average {os.getloadavg()[0]:.1f}\n")
    print(HEADER, flush=True)
    for mixture in mixtures:
        command = [sys.executable, __file__, "--child", "--mixtures", mixture, "--steps", str(args.steps)]
        command += ["--k", str(args.k), "--tasks", str(args.tasks)]
        with tempfile.NamedTemporaryFile("w", prefix=f"bench-{mixture}-", suffix=".log", delete=False) as log:
            if subprocess.run(command, stderr=log).returncode:
                sys.exit(f"{mixture} failed; its log: {log.name}")
            Path(log.name).unlink()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
