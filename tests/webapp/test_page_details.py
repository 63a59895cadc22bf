"""Small things a new user meets in the first hour: the env filter matches part of a name, every page has a
favicon that is served."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

from webapp.models import Run

pytestmark = pytest.mark.django_db


def test_the_env_filter_matches_part_of_the_name_in_any_case(client, user):
    Run.objects.create(name="room", owner=user, env="MiniHack-Room-5x5")
    Run.objects.create(name="shop", owner=user, env="WebShop-synth")
    client.force_login(user)
    for needle in ("Room-5x5", "room-5x5", "MiniHack-Room-5x5"):
        page = client.get(reverse("home"), {"env": needle}).content.decode()
        assert ">room</a>" in page and ">shop</a>" not in page, needle


def test_every_page_links_a_favicon_that_exists(client, user):
    client.force_login(user)
    page = client.get(reverse("home")).content.decode()
    assert '<link rel="icon" href="/static/favicon.svg"' in page
    assert finders.find("favicon.svg")
