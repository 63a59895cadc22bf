"""A new user's first page: what to do first (launch, open a committed result, read the guide), and the guide,
the project's docs/ read inside the product with their links kept inside it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from webapp.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def test_a_user_with_no_run_is_told_what_to_do_first_and_it_goes_once_they_have_one(client, launcher):
    client.force_login(launcher)
    page = client.get(reverse("home")).content.decode()
    start = page[page.index('id="start-here"') : page.index("</section>", page.index('id="start-here"'))]
    assert 'href="/runs/launch/?template=cpu-room-random-grpo.toml"' in start
    assert 'href="/experiments/room-random/"' in start and 'href="/guide/getting-started/"' in start
    assert client.get("/runs/launch/?template=cpu-room-random-grpo.toml").status_code == 200
    Run.objects.create(name="mine", owner=launcher)
    assert 'id="start-here"' not in client.get(reverse("home")).content.decode()


def test_the_guide_shows_the_docs_with_links_kept_inside_it_and_escapes_raw_html(client, user):
    client.force_login(user)
    page = client.get(reverse("guide")).content.decode()
    assert 'id="guide-pages"' in page and 'href="/guide/getting-started/"' in page
    started = client.get(reverse("guide_page", args=["getting-started"])).content.decode()
    assert "<h1>" in started and not re.search(r'href="[a-z-]+\.md', started)
    assert 'href="/guide/launches/' in client.get(reverse("guide_page", args=["index"])).content.decode()
    for bad in ["nope", "..", "design.md"]:
        assert client.get(f"/guide/{bad}/").status_code == 404
    client.logout()
    assert client.get(reverse("guide")).status_code == 302  # login first, like every page
