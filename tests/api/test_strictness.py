"""The API acts only on requests it reads exactly as written: a body that is not a JSON object, a key it does
not document, a value of another JSON type, an integer out of range or a value not among a parameter's
choices is refused with 422 (``{detail, errors}`` naming what was refused), never guessed at, never a 500."""

from __future__ import annotations

import pytest

from tests.api.conftest import bearer, make_run
from webapp.models import Run

pytestmark = pytest.mark.django_db

HUGE = "99999999999999999999"
"""Beyond PostgreSQL's bigint."""
BIGINT_MAX = str(2**63 - 1)


@pytest.fixture
def api(client, launcher):
    """A client whose every request carries the launcher's read-write token."""
    client.defaults |= {"HTTP_AUTHORIZATION": bearer(launcher)["Authorization"]}
    return client


@pytest.fixture
def run(launcher) -> Run:
    return make_run(launcher)


@pytest.fixture(params=["launch", "clone"])
def launch_url(request, run) -> str:
    """Both operations that take a launch body."""
    return "/api/v1/runs" if request.param == "launch" else f"/api/v1/runs/{run.id}/clone"


def _post_text(api, url: str, text: str):
    return api.post(url, text, content_type="application/json")


def _refused(response, *keys: str) -> dict:
    """The 422 body, after checking that it names each of ``keys`` in its detail and its errors."""
    assert response.status_code == 422, response.content
    body = response.json()
    for key in keys:
        assert key in body["errors"] and f"{key}: " in body["detail"], body
    return body


@pytest.mark.parametrize("text", ["[1,2]", "[]", '"x"', "1", "null", "true", ""])
def test_a_launch_body_that_is_not_a_json_object_is_refused_and_launches_nothing(api, run, launch_url, text):
    body = _refused(_post_text(api, launch_url, text), "body")
    assert body["errors"] == {"body": ["send a JSON object"]}
    assert list(Run.objects.all()) == [run]


def test_unknown_body_keys_are_refused_by_name_and_launch_nothing(api, run, launch_url):
    response = _post_text(
        api, launch_url, '{"owner": 1, "id": 2, "status": "running", "uid": "u", "name": "x"}'
    )
    body = _refused(response, "owner", "id", "status", "uid")
    assert set(body["errors"]) == {"owner", "id", "status", "uid"}
    assert body["errors"]["owner"] == ["unknown key"]
    assert list(Run.objects.all()) == [run]


@pytest.mark.parametrize(
    ("text", "key"),
    [('{"n_seeds": "2"}', "n_seeds"), ('{"n_seeds": 2.0}', "n_seeds"), ('{"n_seeds": true}', "n_seeds"),
     ('{"shared": 1}', "shared"), ('{"shared": "true"}', "shared"), ('{"name": 5}', "name"),
     ('{"tags": "a, b"}', "tags"), ('{"tags": ["a", 1]}', "tags.1"), ('{"config": [["steps", 3]]}', "config"),
     ('{"experiment_seeds": ["1"]}', "experiment_seeds.0")],
)  # fmt: skip
def test_a_known_key_of_another_json_type_is_refused_not_coerced(api, run, launch_url, text, key):
    _refused(_post_text(api, launch_url, text), key)
    assert list(Run.objects.all()) == [run]


def test_a_launch_preset_and_base_are_keys_of_a_launch_only_not_of_a_clone(api, run):
    _refused(_post_text(api, f"/api/v1/runs/{run.id}/clone", '{"preset": "cpu"}'), "preset")


def test_config_stays_a_free_dict_whose_keys_the_launch_form_judges(api, run, launch_url):
    response = _post_text(api, launch_url, '{"config": {"steps": 3, "owner": "mallory"}}')
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert list(errors) == ["config"] and "owner" in errors["config"][0]
    assert list(Run.objects.all()) == [run]


@pytest.mark.parametrize("text", ["{bad", '{"config": {"actor.lr": NaN}}', '{"n_seeds": Infinity}',
                                  '{"name": "a", "name": "b"}', "\xff"])  # fmt: skip
def test_a_body_that_is_not_strict_json_is_refused_with_a_reason(api, run, launch_url, text):
    response = _post_text(api, launch_url, text)
    assert response.status_code == 400 and response.json()["detail"]
    assert list(Run.objects.all()) == [run]


@pytest.mark.parametrize(
    ("query", "key"),
    [(f"offset={HUGE}", "offset"), ("offset=-1", "offset"), (f"limit={HUGE}", "limit"), ("limit=0", "limit"),
     ("limit=1001", "limit")],
)  # fmt: skip
@pytest.mark.parametrize(
    "path", ["runs", "runs/{run}/bank", "runs/{run}/episodes", "runs/{run}/metrics/rows"]
)
def test_a_page_out_of_range_is_refused_not_failed_in_the_database(api, run, path, query, key):
    _refused(api.get(f"/api/v1/{path.format(run=run.id)}?{query}"), key)


@pytest.mark.parametrize(
    ("url", "key"),
    [(f"runs/{HUGE}", "run_id"), ("runs/0", "run_id"), (f"runs/{HUGE}/metrics", "run_id"),
     (f"runs/{{run}}/bank/{HUGE}", "entry_id"), (f"runs/{{run}}/episodes?step={HUGE}", "step"),
     ("runs/{run}/episodes?step=-1", "step"), (f"runs/{{run}}/metrics/rows?after={HUGE}", "after"),
     ("runs/{run}/metrics/rows?after=-1", "after")],
)  # fmt: skip
def test_an_id_step_or_cursor_out_of_range_is_refused_not_failed_in_the_database(api, run, url, key):
    _refused(api.get(f"/api/v1/{url.format(run=run.id)}"), key)


@pytest.mark.parametrize("action", ["clone", "resume", "cancel"])
def test_a_write_on_a_run_id_out_of_range_is_refused_and_changes_nothing(api, run, action):
    _refused(_post_text(api, f"/api/v1/runs/{HUGE}/{action}", "{}"), "run_id")
    assert list(Run.objects.all()) == [run] and run.status == Run.Status.QUEUED


def test_the_largest_offset_and_cursor_answer_an_empty_page(api, run):
    for path in ["runs", f"runs/{run.id}/bank", f"runs/{run.id}/episodes", f"runs/{run.id}/metrics/rows"]:
        page = api.get(f"/api/v1/{path}", {"offset": BIGINT_MAX})
        assert page.status_code == 200 and page.json()["items"] == [], path
    rows = api.get(f"/api/v1/runs/{run.id}/metrics/rows", {"after": BIGINT_MAX}).json()
    assert rows == {"items": [], "count": 0}


@pytest.mark.parametrize(
    ("url", "key", "allowed"),
    [("runs/{run}/bank?sort=evil", "sort", ["recent", "usage", "success"]),
     ("runs/{run}/metrics/rows?kind=evil", "kind", ["train", "eval"]),
     ("runs?sort=evil", "sort", ["created", "oldest", "success"]),
     ("runs?status=evil", "status", ["queued", "lost"]),
     ("runs?method=evil", "method", ["grpo", "complementary"]),
     ("runs/{run}/bank?pinned=evil", "pinned", [])],
)  # fmt: skip
def test_an_unknown_choice_is_refused_listing_the_allowed_ones(api, run, url, key, allowed):
    (message,) = _refused(api.get(f"/api/v1/{url.format(run=run.id)}"), key)["errors"][key]
    assert all(f"'{value}'" in message for value in allowed), message


def test_an_empty_run_list_choice_means_the_default_as_on_the_page(api, run):
    page = api.get("/api/v1/runs", {"status": "", "method": "", "sort": ""})
    assert page.status_code == 200 and page.json()["count"] == 1


def test_a_bank_scope_longer_than_any_scope_is_refused(api, run):
    _refused(api.get(f"/api/v1/runs/{run.id}/bank", {"scope": "s" * 101}), "scope")


def test_the_run_lists_form_refusals_have_the_same_shape(api):
    _refused(api.get("/api/v1/runs", {"q": "q" * 101}), "q")


def test_the_schema_lists_each_parameters_choices_and_bounds(api):
    paths = api.get("/api/v1/openapi.json").json()["paths"]

    def parameter(path: str, name: str) -> dict:
        (found,) = [p for p in paths[path]["get"]["parameters"] if p["name"] == name]
        return found["schema"]

    assert parameter("/api/v1/runs/{run_id}/bank", "sort")["enum"] == ["recent", "usage", "success"]
    assert "lost" in str(parameter("/api/v1/runs", "status"))
    assert parameter("/api/v1/runs", "offset")["maximum"] == 2**63 - 1
    assert parameter("/api/v1/runs/{run_id}", "run_id")["minimum"] == 1
