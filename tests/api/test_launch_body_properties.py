"""Property-based: any JSON value that is not a launch object (not an object, an unknown key, a known key of
another JSON type) is refused by launch and clone with a 4xx, and no run is made; a well-typed launch object,
however odd its values, is judged (queued or refused), never a server error."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.schemas import LaunchChanges, LaunchIn
from tests.api.conftest import bearer, make_run
from webapp.models import Run

pytestmark = pytest.mark.django_db
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,  # nothing written into the work tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
lookalikes = st.sampled_from(
    [0, 1, 2.0, -1.5, "1", "2", "true", "false", "yes", "", [], {}, ["1"], [1.0], [True]]
)
"""Values a lax reader would take for another type (1 for true, "2" for 2, 2.0 for 2)."""
texts, text_lists = st.text(max_size=20), st.lists(st.text(max_size=10), max_size=3)
ints = st.integers(min_value=-(2**70), max_value=2**70)
configs = st.dictionaries(st.text(max_size=12), json_values, max_size=3)
KEY_VALUES = {
    "config": configs,
    "base": st.none() | configs,
    "name": st.none() | texts,
    "tags": st.none() | text_lists,
    "shared": st.none() | st.booleans(),
    "n_seeds": ints,
    "submission": texts,
    "experiment": texts,
    "experiment_methods": text_lists,
    "experiment_seeds": st.lists(ints, max_size=3),
    "preset": texts,
}
"""Every key of a launch, with the JSON values of its type (the form then judges what they say)."""
JSON_TYPE = {"config": dict, "base": dict, "name": str, "tags": list, "shared": bool, "n_seeds": int,
             "submission": str, "experiment": str, "experiment_methods": list, "experiment_seeds": list,
             "preset": str}  # fmt: skip
"""The same, written out as an oracle for what is of another type: JSON type, and its items' for lists."""
ITEM_TYPE = {"tags": str, "experiment_methods": str, "experiment_seeds": int}
NULLABLE = {"base", "name", "tags", "shared"}


def _is(value, kind: type) -> bool:
    """``isinstance``, except that a bool is not a number (JSON's true is not 1)."""
    return isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)


def _of_its_type(key: str, value) -> bool:
    if value is None:
        return key in NULLABLE
    if not _is(value, JSON_TYPE[key]):
        return False
    return key not in ITEM_TYPE or all(_is(item, ITEM_TYPE[key]) for item in value)


def launch_objects(keys) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional={key: KEY_VALUES[key] for key in keys})


def with_unknown_key(keys) -> st.SearchStrategy[dict]:
    unknown = st.text(min_size=1).filter(lambda k: k not in keys)
    return st.builds(lambda body, key, value: body | {key: value}, launch_objects(keys), unknown, json_values)


def with_mistyped_key(keys) -> st.SearchStrategy[dict]:
    """One key of another JSON type, alone (nothing else for the form to refuse) or among well-typed keys."""

    def mistyped(key: str) -> st.SearchStrategy[dict]:
        wrong = (lookalikes | json_values).filter(lambda v: not _of_its_type(key, v))
        return st.builds(lambda body, value: body | {key: value}, st.just({}) | launch_objects(keys), wrong)

    return st.sampled_from(sorted(keys)).flatmap(mistyped)


not_objects = json_values.filter(lambda v: not isinstance(v, dict))


@pytest.fixture
def api(client, launcher, settings):
    """The launcher's read-write token on every request, under a rate limit these examples stay within."""
    settings.STUDIO_API_RATE = "100000/min"
    client.defaults |= {"HTTP_AUTHORIZATION": bearer(launcher)["Authorization"]}
    return client


@pytest.fixture
def source(launcher) -> Run:
    """The run that clones copy; the only run there may ever be."""
    return make_run(launcher)


@pytest.fixture(params=["launch", "clone"])
def endpoint(request, source) -> tuple[str, set[str]]:
    """An operation taking a launch body, and the keys of its body."""
    if request.param == "launch":
        return "/api/v1/runs", set(LaunchIn.model_fields)
    return f"/api/v1/runs/{source.id}/clone", set(LaunchChanges.model_fields)


def _post(api, url: str, body) -> int:
    return api.post(url, json.dumps(body), content_type="application/json").status_code


def _assert_refused_and_nothing_launched(api, url: str, source: Run, body) -> None:
    status = _post(api, url, body)
    assert 400 <= status < 500, (body, status)
    assert list(Run.objects.all()) == [source]


def test_the_strategies_know_every_key_of_a_launch():
    assert set(KEY_VALUES) == set(JSON_TYPE) == set(LaunchIn.model_fields)


@SETTINGS
@given(data=st.data())
def test_a_launch_body_that_is_not_a_json_object_is_refused_and_launches_nothing(api, source, endpoint, data):
    url, _ = endpoint
    _assert_refused_and_nothing_launched(api, url, source, data.draw(not_objects))


@SETTINGS
@given(data=st.data())
def test_a_launch_body_with_an_unknown_key_is_refused_and_launches_nothing(api, source, endpoint, data):
    url, keys = endpoint
    _assert_refused_and_nothing_launched(api, url, source, data.draw(with_unknown_key(keys)))


@settings(SETTINGS, max_examples=100)  # most wrong types are refused anyway: the lookalikes need more draws
@given(data=st.data())
def test_a_launch_body_with_a_key_of_another_type_is_refused_and_launches_nothing(
    api, source, endpoint, data
):
    url, keys = endpoint
    _assert_refused_and_nothing_launched(api, url, source, data.draw(with_mistyped_key(keys)))


@SETTINGS
@given(body=launch_objects(LaunchIn.model_fields))
def test_a_well_typed_launch_body_is_queued_or_refused_never_a_server_error(api, body):
    assert _post(api, "/api/v1/runs", body) in (200, 201, 422), body
