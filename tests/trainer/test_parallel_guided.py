"""A two-process complementary run whose guided episodes cannot ask (``no_search_and_ask``) spreads them over
both ranks (issue 47): rank 1's guided episodes get their experiences from rank 0's bank through the
retrieval collective, and the bank still has one writer: every episode distilled once, no entry twice.

The two ranks are two "nodes" on localhost (``--nnodes 2``): each starts its own torchrun of one process and
the two meet through the c10d rendezvous, as on two machines; the run is the one-node group's (every metric
row once, πϕ trained in rounds of both ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.trainer.test_parallel_group import COMPLEMENTARY, _status, make_run  # noqa: F401 (a fixture)
from webapp.models import EpisodeRecord, MetricRow, Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_on_two_nodes_spreads_guided_episodes_and_rank_0s_bank_serves_them_all(make_run, tmp_path):  # noqa: F811
    from django.conf import settings
    from django.db import connection

    from experience.models import Experience
    from tests.webapp.conftest import free_port

    run = make_run(**(COMPLEMENTARY | {"no_search_and_ask": True}))
    run.claim(worker="two nodes on localhost")
    port = free_port()
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"r{run.pk}"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    node = [*launcher, *rendezvous, str(settings.BASE_DIR / "manage.py"), "train_claimed", str(run.pk)]
    env = os.environ | {"STUDIO_DB_NAME": connection.settings_dict["NAME"], "OMP_NUM_THREADS": "1"}
    logs = [open(tmp_path / f"node{i}.log", "wb") for i in range(2)]  # noqa: SIM115
    where = {"env": env, "cwd": settings.BASE_DIR, "start_new_session": True}
    nodes = [subprocess.Popen(node, stdout=log, stderr=log, **where) for log in logs]
    try:
        codes = [p.wait(timeout=900) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for log in logs:
            log.close()
    assert codes == [0, 0], (tmp_path / "node0.log").read_text(errors="replace")[-3000:]
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, _status(run)
    rows = {(r.kind, r.step): r.values for r in MetricRow.objects.filter(run=run)}
    assert MetricRow.objects.filter(run=run).count() == len(rows) == 5  # evals 0 and 3, steps 1-3: once each
    last = rows["train", 3]
    assert last["rank/0/episodes"] == last["rank/1/episodes"] == 2
    assert last["rank/0/guided"] == last["rank/1/guided"] == 1  # one guided and one free each
    assert last["extractor/distilled"] == 12  # every episode of the three steps, once
    assert last["extractor/updates"] >= 1  # πϕ's updates: rounds both ranks joined
    texts = list(Experience.objects.in_bank(run.pk, None).values_list("content", flat=True))
    assert len(texts) == len(set(texts)) == last["bank/size"] > 0
    # once the bank holds entries, each guided episode gets one, rank 1's as rank 0's (the same query: the
    # two guided rollouts of a step share their task instance)
    guided = EpisodeRecord.objects.filter(run=run, guided=True)
    by_batch: dict[tuple[str, int], list[bool]] = {}
    for e in guided:
        by_batch.setdefault((e.kind, e.step), []).append(e.experience_id is not None)
    assert all(len(set(found)) == 1 for found in by_batch.values()), by_batch
    assert any(all(found) for (kind, _), found in by_batch.items() if kind == "train"), by_batch
    assert all(by_batch["eval", 3]) and len(by_batch["eval", 3]) == 2  # the with-experience column
