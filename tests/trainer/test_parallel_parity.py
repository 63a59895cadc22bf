"""A complementary run on 1, 2 and 4 processes is the same run (issue 47): the same episodes with the same
actions, the same bank changes in the same order, the same weights within the parity tolerances, and every
step trains. Each rank plays its share of guided and free episodes; the bank, its one writer and the
extractor track are rank 0's, πϕ trains sharded over every rank.

The runs are ``manage.py train_claimed`` under torchrun, as a worker's supervisor starts them, with
``experience.lockstep`` (the actor waits for the track after each step, so what a step retrieves does not
depend on timing) and a recency window longer than the run. The actor is a tiny Llama made to walk
(``walking_llama_folder``: a random model never wins, so nothing would update and parity would prove
nothing); πϕ is SmolLM2 with structured output, so its operations reach the bank. The 2-process run is two
"nodes" on localhost that meet through the c10d rendezvous, as on two machines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.test_parallel import _max_abs
from tests.trainer.test_parallel_group import COMPLEMENTARY, _status, make_run  # noqa: F401 (a fixture)
from tests.trainer.tiny_models import walking_llama_folder
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.training import run_dir

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 2
PARITY = COMPLEMENTARY | {
    "env": "MiniHack-Room-Random-5x5", "steps": STEPS, "tasks_per_step": 2, "k_rollouts": 4,
    "eval_every": STEPS, "eval_episodes": 2, "rollout.turn_limit": 15, "experience.merge_every": 2,
    "experience.lockstep": True, "experience.recency_window_s": 1e6, "checkpoint_every": 0,
    "extractor.kv_cache_gib": 0.25, "rollout.dtype": "float32",
}  # fmt: skip
"""8 episodes a step (2 task instances x 2 guided + 2 free), which a walking actor wins sometimes; a merge
pass after step 2. The engines compute in float32: πϕ's weights on N processes differ from one process's
by up to ~lr where AdamW meets a near-zero gradient, and in bfloat16 such a difference can round a weight to
the next bfloat16 value, enough to change a sampled token now and then (CI once saw a merge answer differ
so)."""
WEIGHTS_TOLERANCE = 1e-5
"""Largest weight difference from the 1-process run after the run's updates: sharded gradients are
reduced in another order (relative error < 1e-5 in tests/trainer/test_parallel.py), and AdamW can turn such
a difference in a near-zero gradient into up to ~lr per step."""


def _start(run: Run, nnodes: int, nproc: int, logs: Path) -> list[subprocess.Popen]:
    """``train_claimed`` for ``run`` on ``nnodes`` torchrun nodes of ``nproc`` processes (one plain process
    for 1 x 1), as the worker's supervisor would start it; its log in ``logs``."""
    from django.conf import settings
    from django.db import connection

    from tests.webapp.conftest import free_port

    run.claim(worker=f"{nnodes} x {nproc} on localhost")
    command = [str(settings.BASE_DIR / "manage.py"), "train_claimed", str(run.pk)]
    if nnodes * nproc > 1:
        port = free_port()
        launcher = ["-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc)]
        launcher += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        launcher += ["--rdzv-id", f"r{run.pk}"]
        command = launcher + command
    env = os.environ | {"STUDIO_DB_NAME": connection.settings_dict["NAME"], "OMP_NUM_THREADS": "1"}
    where = {"env": env, "cwd": settings.BASE_DIR, "start_new_session": True}
    nodes = []
    for i in range(nnodes):
        with open(logs / f"run{run.pk}-node{i}.log", "wb") as log:
            nodes.append(subprocess.Popen([sys.executable, *command], stdout=log, stderr=log, **where))
    return nodes


def _finish(run: Run, nodes: list[subprocess.Popen], logs: Path) -> None:
    """Wait for the run's processes; it must have succeeded."""
    try:
        codes = [p.wait(timeout=900) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert codes == [0] * len(nodes), (logs / f"run{run.pk}-node0.log").read_text(errors="replace")[-3000:]
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, _status(run)


def _episodes(run: Run) -> list[tuple]:
    """Each episode as played: batch, task instance and seed, column, the entry injected, and every action."""
    rows = EpisodeRecord.objects.filter(run=run).order_by("step", "-kind", "id")  # a step, then its eval
    return [
        (e.kind, e.step, e.task_instance, e.seed, e.guided, e.injected_experience, e.success,
         [t["action_text"] for t in e.turns])
        for e in rows
    ]  # fmt: skip


def _bank_changes(run: Run) -> list[tuple]:
    """Every change to the run's bank in order, entries named by the order they were created in (ids differ
    between runs)."""
    from experience.models import ExperienceChange

    names: dict[int, int] = {}
    changes = []
    for c in ExperienceChange.objects.filter(run=run).order_by("id"):
        name = names.setdefault(c.experience_id, len(names))
        after = c.after or {}
        text = {k: after.get(k) for k in ("scope", "title", "content", "deleted", "source_episode")}
        text["sampled"] = (after.get("generation") or {}).get("generation_token_ids")
        changes.append((name, c.kind, c.actor, c.step, text))
    return changes


def _same(got: list[tuple], expected: list[tuple], what: str) -> None:
    """Equal lists, or a message that names the first item and the fields that differ."""
    for i, (a, b) in enumerate(zip(got, expected, strict=False)):
        fields = [j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        assert not fields, f"{what}: item {i} differs in fields {fields}: {a!r:.1500} != {b!r:.1500}"
    assert len(got) == len(expected), f"{what}: {len(got)} items, not {len(expected)}"


def _one_bank(run: Run, size: float) -> None:
    """Each entry written once: the run's bank holds as many entries as it reports, no text twice."""
    from experience.models import Experience

    texts = list(Experience.objects.in_bank(run.pk, None).values_list("content", flat=True))
    assert len(texts) == len(set(texts)) == size > 0, (run.pk, len(texts), len(set(texts)), size)


def _merges(run: Run) -> list[tuple]:
    """Every merge chunk: its step, the entries πϕ saw (so a different answer to the same prompt shows as
    such), what it answered and what was decided."""
    from experience.models import Merge

    rows = Merge.objects.filter(run=run).order_by("id")
    return [
        (m.step, m.chunk, [(e.get("title"), e.get("content")) for e in m.inputs], m.raw_output, m.decision)
        for m in rows
    ]


def _weights(run: Run, part: str) -> dict[str, torch.Tensor]:
    folder = run_dir(run) / "checkpoints" / f"step-{STEPS:06d}" / part
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights |= load_file(f)
    assert weights, f"no weights in {folder}"
    return weights


def _rows(run: Run) -> dict[tuple[str, int], dict]:
    rows = {(r.kind, r.step): r.values for r in MetricRow.objects.filter(run=run)}
    assert MetricRow.objects.filter(run=run).count() == len(rows)  # each row once
    return rows


def test_a_complementary_run_on_one_two_and_four_processes_is_the_same_run(make_run, tmp_path):  # noqa: F811
    walking = walking_llama_folder(tmp_path / "walking")
    config = PARITY | {"actor.model_path": str(walking)}
    layouts = {1: (1, 1), 2: (2, 1), 4: (1, 4)}  # (nodes, processes a node)
    runs = {n: make_run(**(config | {"nproc": n})) for n in layouts}
    # 1 and 2 processes at once, then 4 (all seven processes at once do not fit in 24 GB): lockstep makes
    # each run independent of timing, and one run's ranks use the cores while another's wait
    for group in ((1, 2), (4,)):
        started = {n: _start(runs[n], *layouts[n], tmp_path) for n in group}
        for n, nodes in started.items():
            _finish(runs[n], nodes, tmp_path)
    one = runs[1]
    rows = _rows(one)
    assert set(rows) == {("eval", 0), ("eval", STEPS)} | {("train", s) for s in range(1, STEPS + 1)}
    # every step trains: groups won and lost, so the actor's gradients are not zero; πϕ updates too
    for step in range(1, STEPS + 1):
        assert 0 < rows["train", step]["train/success"] < 1, step
        assert rows["train", step]["actor/grad_norm"] > 0, step
    assert rows["train", STEPS]["extractor/updates"] >= 1
    assert _max_abs(_weights(one, "actor"), load_file(walking / "model.safetensors")) > 1e-6
    episodes, changes, merges = _episodes(one), _bank_changes(one), _merges(one)
    assert len(episodes) == STEPS * 8 + 2 * 2 * 2  # and two evaluations of 2 episodes in each column
    assert any(e[5] for e in episodes if e[0] == "train")  # guided episodes got entries from the bank
    assert "add" in {c[1] for c in changes} and "merge_add" in {c[1] for c in changes}
    _one_bank(one, rows["train", STEPS]["bank/size"])
    assert all(e[5] for e in episodes if e[:2] == ("eval", STEPS) and e[4])  # the with-experience column

    for n in (2, 4):
        run = runs[n]
        _same(_merges(run), merges, f"merges on {n} processes")
        _same(_bank_changes(run), changes, f"bank changes on {n} processes")
        _same(_episodes(run), episodes, f"episodes on {n} processes")
        for part in ("actor", "extractor"):
            assert _max_abs(_weights(run, part), _weights(one, part)) < WEIGHTS_TOLERANCE, (n, part)
        assert set(_rows(run)) == set(rows)
        last = _rows(run)["train", STEPS]
        for rank in range(n):  # each rank played its share of guided and of free episodes
            assert last[f"rank/{rank}/episodes"] == 8 / n and last[f"rank/{rank}/guided"] == 4 / n, (n, rank)
        assert last["extractor/distilled"] == rows["train", STEPS]["extractor/distilled"] == STEPS * 8
        _one_bank(run, last["bank/size"])
