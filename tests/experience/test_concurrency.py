"""Many searches while operations write: no errors, no lost writes, every result a consistent entry."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Sum

from experience.manager import ExperienceManager
from experience.models import Experience, ExperienceChange
from trainer.store import Add, Update

SEARCHERS, WRITERS, SECONDS = 32, 4, 4.0
TAG = re.compile(r"^\[w(\d+) e(\d+) r(\d+)\]")
TOPICS = [
    "heat the mug",
    "cool the apple",
    "clean the plate",
    "find the key",
    "open the drawer",
    "buy red shoes",
]


def text_for(writer: int, entry: int, revision: int) -> tuple[str, str]:
    tag = f"[w{writer} e{entry} r{revision}]"
    topic = TOPICS[(writer + entry + revision) % len(TOPICS)]
    return f"{tag} How to {topic}", f"{tag} To {topic}: go to it, use the right receptacle, check the result."


@pytest.mark.django_db(transaction=True)
def test_searches_and_writes_run_concurrently_without_loss(run, embedder):
    manager = ExperienceManager(run.pk, embedder=embedder)
    manager.apply([Add("alfworld", *text_for(9, i, 0)) for i in range(20)], step=0)
    queries = [f"goal: {t} in room {i}, observation: a kitchen" for t in TOPICS for i in range(6)]
    embedder.embed(queries)  # warm the cache: the CPU goes to searching and writing
    stop = threading.Event()
    errors: list[BaseException] = []
    returned: Counter[int] = Counter()
    returned_lock = threading.Lock()
    expected: dict[int, tuple[str, str, int]] = {}  # entry id -> (title, content, version)
    writes = Counter()

    def searcher(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                [found] = manager.retrieve([rng.choice(queries)], "alfworld")
                assert len(found) == 1
                entry = found[0]
                title_tag, content_tag = TAG.match(entry.title), TAG.match(entry.content)
                assert title_tag and content_tag and title_tag.groups() == content_tag.groups(), entry
                with returned_lock:
                    returned[entry.id] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def writer(w: int) -> None:
        rng = random.Random(100 + w)
        mine: dict[int, list[int]] = {}  # entry id -> [entry number, revision]
        try:
            while not stop.is_set():
                if not mine or rng.random() < 0.4:
                    n = len(mine)
                    [result] = manager.apply([Add("alfworld", *text_for(w, n, 0))], step=1)
                    mine[result.entry_id] = [n, 0]
                    with returned_lock:
                        writes["add"] += 1
                else:
                    entry_id = rng.choice(list(mine))
                    mine[entry_id][1] += 1
                    [result] = manager.apply([Update(entry_id, *text_for(w, *mine[entry_id]))], step=2)
                    with returned_lock:
                        writes["update"] += 1
                assert result.ok, result
            for entry_id, (n, revision) in mine.items():
                expected[entry_id] = (*text_for(w, n, revision), revision + 1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=searcher, args=(i,)) for i in range(SEARCHERS)]
    threads += [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    start = time.monotonic()  # at least SECONDS, and enough searches even on a loaded machine
    while time.monotonic() - start < SECONDS or (
        sum(returned.values()) < 200 and time.monotonic() - start < 60
    ):
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(60)
    manager.close()
    print(f"{sum(returned.values())} retrievals, {writes['add']} adds, {writes['update']} updates")
    assert not errors, errors[:3]
    assert sum(returned.values()) >= 200 and writes["add"] >= WRITERS and writes["update"] > 0
    rows = {e.pk: e for e in Experience.objects.filter(pk__in=expected)}
    assert {i: (e.title, e.content, e.version) for i, e in rows.items()} == expected  # no lost write
    assert ExperienceChange.objects.filter(kind="update").count() == writes["update"]
    assert ExperienceChange.objects.filter(kind="add").count() == writes["add"] + 20
    for entry_id, count in returned.items():  # every retrieval counted exactly once
        assert Experience.objects.get(pk=entry_id).retrieval_count == count
    total = Experience.objects.aggregate(n=Sum("retrieval_count"))["n"]
    assert total == sum(returned.values()) == manager.stats.queries
