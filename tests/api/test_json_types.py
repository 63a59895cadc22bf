"""A launch's config values are taken only as the JSON type of their setting (issue 49): an integer setting
takes a JSON integer, a number one an integer or a number, a switch a boolean, text a string; an object is
never a value. Each refusal is a 422 naming the key; nothing is launched."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.launch import SETTING_TYPES, _plain, _refusal
from tests.api.conftest import bearer
from webapp.models import Run

pytestmark = pytest.mark.django_db

REFUSED = [
    ({"steps": {}}, "steps"),
    ({"steps": "1"}, "steps"),
    ({"k_rollouts": "4"}, "k_rollouts"),
    ({"k_rollouts": 2.0}, "k_rollouts"),
    ({"seed": "0"}, "seed"),
    ({"seed": True}, "seed"),
    ({"actor.lr": True}, "actor.lr"),
    ({"actor.lr": "1e-5"}, "actor.lr"),
    ({"actor": {"lr": {}}}, "actor.lr"),
]


@pytest.mark.parametrize(("config", "key"), REFUSED, ids=[str(c) for c, _ in REFUSED])
@pytest.mark.parametrize("operation", ["runs", "plan"])
def test_a_value_of_another_json_type_is_refused_naming_its_key(client, launcher, config, key, operation):
    headers = {"HTTP_AUTHORIZATION": bearer(launcher)["Authorization"]}
    response = client.post(f"/api/v1/{operation}", {"config": config}, "application/json", **headers)
    assert response.status_code == 422, response.content
    assert list(response.json()["errors"]) == [key]
    assert not Run.objects.exists()


def test_values_of_the_right_json_type_still_launch(client, launcher):
    headers = {"HTTP_AUTHORIZATION": bearer(launcher)["Authorization"]}
    config = {"steps": 2, "k_rollouts": 4, "actor.lr": 1, "actor": {"clip_eps": 0.2}}
    response = client.post("/api/v1/plan", {"config": config}, "application/json", **headers)
    assert response.status_code == 200, response.content


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(SETTING_TYPES)), value=JSON_SCALARS)
def test_a_value_passes_exactly_when_its_json_type_is_the_settings(key, value):
    kind = _plain(SETTING_TYPES[key])
    fits = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[kind]
    assert (_refusal(SETTING_TYPES[key], value) is None) == (fits or value is None)
