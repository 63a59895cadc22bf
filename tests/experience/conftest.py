from __future__ import annotations

import pytest

from experience.embedding import default_embedder
from experience.manager import ExperienceManager
from webapp.models import Run


@pytest.fixture(scope="session")
def embedder():
    """The real all-MiniLM-L6-v2 embedder, loaded once (the same object services use)."""
    return default_embedder()


@pytest.fixture
def run(user):
    return Run.objects.create(name="bank test", owner=user, method="complementary")


@pytest.fixture
def manager(run, embedder):
    with ExperienceManager(run.pk, embedder=embedder) as m:
        yield m
