"""A two-process complementary run whose guided episodes cannot ask (``no_search_and_ask``) spreads them over
both ranks (issue 47): rank 1's guided episodes get their experiences from rank 0's bank through the
retrieval collective, and the bank still has one writer: every episode distilled once, no entry twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.trainer.test_parallel_group import COMPLEMENTARY, _status, make_run  # noqa: F401 (a fixture)
from webapp.models import EpisodeRecord, MetricRow, Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_two_process_run_spreads_guided_episodes_and_rank_0s_bank_serves_them_all(make_run, tmp_path):  # noqa: F811
    from django.conf import settings
    from django.db import connection

    from experience.models import Experience

    run = make_run(**(COMPLEMENTARY | {"no_search_and_ask": True}))
    run.claim(worker="two processes")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command = [*launcher, str(settings.BASE_DIR / "manage.py"), "train_claimed", str(run.pk)]
    env = os.environ | {"STUDIO_DB_NAME": connection.settings_dict["NAME"], "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "group.log", "wb") as log:
        group = subprocess.Popen(
            command, stdout=log, stderr=log, env=env, cwd=settings.BASE_DIR, start_new_session=True
        )
        try:
            code = group.wait(timeout=900)
        finally:
            if group.poll() is None:
                os.killpg(group.pid, signal.SIGKILL)
    assert code == 0, (tmp_path / "group.log").read_text(errors="replace")[-3000:]
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, _status(run)
    rows = {(r.kind, r.step): r.values for r in MetricRow.objects.filter(run=run)}
    last = rows["train", 3]
    assert last["rank/0/episodes"] == last["rank/1/episodes"] == 2
    assert last["rank/0/guided"] == last["rank/1/guided"] == 1  # one guided and one free each
    assert last["extractor/distilled"] == 12  # every episode of the three steps, once
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
