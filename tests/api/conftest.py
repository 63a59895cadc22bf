"""Fixtures for the REST API: users with and without the launch permission, staff, tokens, runs."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Permission

from api.tokens import token_create
from trainer.config import get_preset
from webapp.models import Run


@pytest.fixture(autouse=True)
def rate_limit_of_its_own(settings):
    """Each test counts requests under a key prefix of its own: Redis is shared by every test database, and
    user ids repeat across them. Passwords hash fast: these tests are about tokens, not password storage."""
    api_cache = settings.CACHES["api"] | {"KEY_PREFIX": f"test-api-{uuid.uuid4().hex}"}
    settings.CACHES = settings.CACHES | {"api": api_cache}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def grant_launch(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


@pytest.fixture
def launcher(user):
    return grant_launch(user)


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("carol", password="correct horse battery", is_staff=True)


def bearer(user, scope: str = "read-write") -> dict[str, str]:
    """Request headers carrying a new token of ``user``."""
    _, secret = token_create(user, f"{scope} token", scope)
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def checkpoint(tmp_path) -> str:
    """A run folder holding a checkpoint, so its run can be resumed."""
    (tmp_path / "state.json").write_text("{}")
    return str(tmp_path)


def make_run(owner, **fields) -> Run:
    return Run.objects.create(
        name=fields.pop("name", "r"), owner=owner, config=get_preset("cpu").to_dict(), **fields
    )
