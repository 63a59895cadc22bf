"""The API's plan: ``POST /api/v1/plan`` answers a launch body's plan without launching, a launch's answer
carries the plan it was accepted on, and a launch that fits no worker is refused (422) with the plan's
numbers, as the launch form refuses it."""

from __future__ import annotations

import pytest

from tests.api.conftest import bearer
from tests.webapp.test_launch_plan import ABSURD
from tests.webapp.test_worker_devices import registry_of_its_own, worker  # noqa: F401 - a fixture
from trainer.config import get_preset
from webapp.models import Run
from webapp.workers import check, register, stand_in

pytestmark = pytest.mark.django_db

BODIES = {name: {"config": changes} for name, changes in ABSURD.items()} | {
    "the paper preset": {"preset": "paper"}
}


@pytest.fixture
def api(client, launcher, settings):
    """A client whose every request carries the launcher's read-write token."""
    settings.STUDIO_ALLOW_HUB_MODELS = True  # the paper preset names its models by hub id
    client.defaults |= {"HTTP_AUTHORIZATION": bearer(launcher)["Authorization"]}
    return client


def _post(api, url: str, body):
    return api.post(url, body, content_type="application/json")


def _config(body: dict):
    return get_preset(body.get("preset", "cpu")).with_overrides(**body.get("config", {}))


@pytest.mark.parametrize("name", BODIES)
def test_a_launch_that_fits_no_worker_is_refused_with_the_plans_numbers_and_launches_nothing(api, name):
    body = BODIES[name]
    why = check(_config(body), stand_in()).why_not
    assert why is not None and " per device; the worker has 1 × " in why
    refused = _post(api, "/api/v1/runs", body)
    assert refused.status_code == 422 and not Run.objects.exists()
    (message,) = refused.json()["errors"]["plan"]
    assert message == f"no worker can run this launch (this machine (no worker has registered)): {why}"
    assert refused.json()["detail"] == message
    plan = _post(api, "/api/v1/plan", body)
    assert plan.status_code == 200 and not Run.objects.exists()
    answer = plan.json()
    assert (answer["fits"], answer["queue"], answer["refusal"]) == (False, None, message)
    assert answer["peak_bytes"] > answer["device_memory"] == stand_in().devices.memory


def test_the_plan_of_a_launch_that_fits_lists_its_parts_and_where_it_goes_and_the_launch_carries_it(api):
    body = {"config": {"steps": 3, "rollout.max_new_tokens": 40}}
    plan = _post(api, "/api/v1/plan", body)
    expected = check(_config(body), stand_in()).plan
    assert plan.status_code == 200 and not Run.objects.exists()
    answer = plan.json()
    assert answer["fits"] and answer["refusal"] is None and answer["queue"] == "training"
    assert answer["parts"] == [{"name": p.name, "bytes": p.bytes, "host": p.host} for p in expected.parts]
    assert answer["peak_bytes"] == expected.device_bytes() and answer["nproc"] == 1
    assert answer["step_s"] == pytest.approx(expected.step_s) and answer["table"] == expected.table()
    launched = _post(api, "/api/v1/runs", body)
    assert launched.status_code == 201 and launched.json()["plan"] == answer
    assert Run.objects.get().config == _config(body).to_dict()  # accepted unchanged


def test_the_plan_goes_by_the_registered_workers_and_names_the_one_that_can_run_it(api):
    register(worker("small@y", "cpu:16GB"))
    register(worker("node@z", "8x80GB"))
    answer = _post(api, "/api/v1/plan", {"config": {"nproc": 8, "device": "cuda", "method": "grpo"}}).json()
    assert answer["fits"] and answer["worker"] == "node@z" and answer["queue"] == "node@z.training"
    assert answer["devices"] == "8 × 80 GB" and answer["nproc"] == 8
    why = {w["node"]: w["why_not"] for w in answer["workers"]}
    assert why["node@z"] is None and why["small@y"].startswith("it asks for CUDA devices")


def test_a_complementary_launch_on_eight_processes_goes_to_the_node_and_says_what_rank_0_holds(api):
    register(worker("node@z", "8x80GB"))
    answer = _post(api, "/api/v1/plan", {"config": {"nproc": 8, "device": "cuda"}}).json()
    assert answer["fits"] and answer["worker"] == "node@z" and answer["refusal"] is None
    assert "every rank plays its share of the guided and of the free episodes" in answer["table"]
    assert "answers every rank's retrievals and Search-and-Ask searches" in answer["table"]


@pytest.mark.parametrize(
    ("body", "key"),
    [([], "body"), ({"config": {}, "surprise": 1}, "surprise"), ({"config": {"nproc": 0}}, "nproc")],
)
def test_the_plan_endpoint_refuses_what_a_launch_refuses(api, body, key):
    refused = _post(api, "/api/v1/plan", body)
    assert refused.status_code == 422 and key in refused.json()["errors"]


def test_planning_needs_the_launch_permission(client, user):
    client.defaults |= {"HTTP_AUTHORIZATION": bearer(user)["Authorization"]}
    assert _post(client, "/api/v1/plan", {}).status_code == 403
