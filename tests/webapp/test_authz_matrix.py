"""Authorization matrix: every URL the resolver knows, and the run socket, for five roles.

Roles: anonymous; ``noperm`` (logged in, no permissions); ``owner`` (owns the private run and its bank, may
launch and edit banks); ``other`` (the same permissions, not the owner); ``staff``. URL parameters are
filled with real objects of the owner's *private* run. GET, and POST with the CSRF cookie and form field a
browser sends, run in the order of ``ROLES`` on one set of objects, so a POST that succeeds for one role
may change what the next one sees (the table states the outcome in that order).

``EXPECTED`` declares every outcome; a URL it does not classify fails the test (classify new ones). The
API (``/api/v1/``) and the admin are classified by prefix: anonymous never gets data from the API, and only
staff reach the admin.
"""

from __future__ import annotations

import numpy as np
import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from experience import bank
from experience.models import EMBEDDING_DIM, ExperienceChange, ImportJob, Merge
from webapp.asgi import application
from webapp.models import Experiment, Run

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "noperm", "other", "owner", "staff")
LOGIN = "login"
"""A redirect to the login page."""
CSRF = "a" * 32
"""The CSRF secret the test's browser holds (cookie) and sends back (form field)."""

# Route name → {method: outcome per role, in the order of ROLES}; an outcome is a status code or L (a redirect
# to the login page). "GET"/"POST" are on the owner's private run (and private experiment); "GET shared"/
# "POST shared" on a shared one, for every route with a run or experiment in its URL.
L = LOGIN
ALL_200 = (L, 200, 200, 200, 200)
NO_GET = (L, 405, 405, 405, 405)  # a method the view does not accept
HIDDEN = (L, 404, 404, 200, 200)  # another user's private run does not exist for them
EDIT_OK = (L, 404, 404, 302, 302)  # done by owner and staff (redirect back with a message)
SHARED_EDIT_OK = (L, 403, 403, 302, 302)  # visible to all, changed only by owner and staff
RUN_PAGE = {"GET": HIDDEN, "POST": HIDDEN, "GET shared": ALL_200, "POST shared": ALL_200}
RUN_ACTION = {"GET": NO_GET, "POST": EDIT_OK, "GET shared": NO_GET, "POST shared": SHARED_EDIT_OK}
EXPECTED: dict[str, dict[str, tuple]] = {
    "home": {"GET": ALL_200, "POST": ALL_200},
    "workers": {"GET": ALL_200, "POST": ALL_200},
    "banks": {"GET": ALL_200, "POST": ALL_200},
    "experiments": {"GET": ALL_200, "POST": ALL_200},
    "guide": {"GET": ALL_200, "POST": ALL_200},
    "guide_page": {"GET": ALL_200, "POST": ALL_200},  # <page> is the objects' "page"
    "compare": {"GET": (L, 302, 302, 302, 302), "POST": (L, 302, 302, 302, 302)},  # no runs: back home
    "compare_csv": {"GET": (L, 400, 400, 400, 400), "POST": (L, 400, 400, 400, 400)},
    "account": {"GET": ALL_200, "POST": ALL_200},
    "token_new": {"GET": NO_GET, "POST": (L, 400, 400, 400, 400)},  # an empty form
    "token_revoke": {"GET": NO_GET, "POST": (L, 404, 404, 302, 404)},  # a token is its user's alone
    "login": {"GET": (200, 302, 302, 302, 302), "POST": (200, 302, 302, 302, 302)},
    "logout": {"GET": NO_GET, "POST": (L, 302, 302, 302, 302)},
    "run_launch": {"GET": (L, 403, 200, 200, 200), "POST": (L, 403, 400, 400, 400)},  # needs launch_run
    "run_launch_plan": {"GET": NO_GET, "POST": (L, 403, 200, 200, 200)},  # the form's plan: launch_run too
    "metrics": {"GET": (401, 403, 403, 403, 200), "POST": (405,) * 5},  # staff or the token; never a login
    "run_detail": RUN_PAGE,
    "run_inspect": RUN_PAGE,
    "run_cancel": RUN_ACTION,
    "run_resume": RUN_ACTION,
    "bank": RUN_PAGE,
    "bank_merges": RUN_PAGE,
    "bank_export": RUN_PAGE,
    "bank_entry": {"GET": HIDDEN, "POST": (L, 404, 404, 400, 400),  # an empty edit form
                   "GET shared": ALL_200, "POST shared": (L, 403, 403, 400, 400)},
    "bank_pin": RUN_ACTION,
    "bank_delete": RUN_ACTION,
    "bank_undo": RUN_ACTION,
    "bank_prune_undo": RUN_ACTION,
    "bank_merge_undo": RUN_ACTION,
    "bank_import": RUN_ACTION,
    "bank_import_cancel": RUN_ACTION,
    "bank_prune": {"GET": (L, 404, 404, 400, 400), "POST": (L, 404, 404, 400, 400),  # no rule chosen
                   "GET shared": (L, 403, 403, 400, 400), "POST shared": (L, 403, 403, 400, 400)},
    "bank_import_job": {"GET": HIDDEN, "POST": NO_GET, "GET shared": (L, 403, 403, 200, 200),
                        "POST shared": NO_GET},  # GET only: 405 before anything is looked up
    "experiment_detail": RUN_PAGE,
    "experiment_report_file": {  # visible or not, no report was built
        m: (L, 404, 404, 404, 404) for m in ("GET", "POST", "GET shared", "POST shared")
    },
}  # fmt: skip

# Prefix rules for the parts another module owns whole.
API_PREFIX = "api/v1/"
ADMIN_PREFIX = "admin/"
ADMIN_PUBLIC = {"/admin/login/"}  # the admin's own login form
SOCKET = "/ws/runs/{run_id}/"
SOCKET_PRIVATE = (False, False, False, True, True)  # accepted, per role
SOCKET_SHARED = (False, True, True, True, True)


def _routes(resolver: URLResolver | None = None, prefix: str = "") -> list[tuple[str, URLPattern]]:
    """Every URL pattern with its full route, walking included resolvers."""
    found = []
    for p in (resolver or get_resolver()).url_patterns:
        route = prefix + str(p.pattern)
        found += _routes(p, route) if isinstance(p, URLResolver) else [(route, p)]
    return found


def _route_key(route: str, pattern: URLPattern) -> str:
    if route.startswith(ADMIN_PREFIX):
        return ADMIN_PREFIX
    if route.startswith(API_PREFIX):
        return API_PREFIX
    return pattern.name or route


@pytest.fixture
def world(make_world):
    return make_world(shared=False)


@pytest.fixture
def make_world(django_user_model):
    return lambda shared: _world(django_user_model, shared)


def _world(django_user_model, shared: bool):
    users = {
        role: django_user_model.objects.create_user(role, is_staff=role == "staff")  # no hashing: fast
        for role in ROLES[1:]
    }
    perms = Permission.objects.filter(codename__in=["launch_run", "edit_bank"])
    assert perms.count() == 2
    for role in ("other", "owner", "staff"):
        users[role].user_permissions.add(*perms)
    owner = users["owner"]
    run = Run.objects.create(name="the run", owner=owner, method="complementary", shared=shared)
    vector = np.ones(EMBEDDING_DIM, dtype=np.float32) / EMBEDDING_DIM**0.5
    entry = bank.add(run.pk, "MiniHack", "A lesson", "Its text.", vector, embedding_model="m")
    experiment = Experiment.objects.create(name="the-grid", owner=owner, shared=shared)
    from api.tokens import token_create

    token, _ = token_create(owner, "t", "read")
    objects = {
        "run_id": run.pk, "entry_id": entry.pk, "merge_id": Merge.objects.create(run=run, decision="keep").pk,
        "change_id": ExperienceChange.objects.get(experience=entry).pk, "name": experiment.name,
        "filename": "report.md", "job_id": ImportJob.objects.create(run=run, status="succeeded").pk,
        "token_id": token.pk, "page": "getting-started",
    }  # fmt: skip
    return users, objects


def _url(route: str, objects: dict) -> str:
    path = route
    for name, value in objects.items():
        for converter in ("int", "slug", "str", "path", ""):
            placeholder = f"<{converter}:{name}>" if converter else f"<{name}>"
            path = path.replace(placeholder, str(value))
    assert not any(c in path for c in "<(^$"), f"no object for a parameter of {route}"
    return "/" + path


def _client(users: dict, role: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = CSRF
    if role != "anonymous":
        client.force_login(users[role])
    return client


def _outcome(response) -> int | str:
    if (
        response.status_code == 302
        and "/login/" in response.get("Location", "")
        and "next=" in response.get("Location", "")
    ):
        return LOGIN
    return response.status_code


def _request(client: Client, method: str, url: str):
    """A page's form posts the token as a field; a script calling the API sends JSON and the header."""
    if method == "GET":
        return client.get(url)
    if url.startswith("/" + API_PREFIX):
        return client.post(url, "{}", content_type="application/json", headers={"X-CSRFToken": CSRF})
    return client.post(url, {"csrfmiddlewaretoken": CSRF})


def test_every_url_is_classified():
    keys = {_route_key(route, pattern) for route, pattern in _routes()}
    unclassified = keys - set(EXPECTED) - {API_PREFIX, ADMIN_PREFIX}
    assert not unclassified, f"classify these URLs in EXPECTED: {sorted(unclassified)}"
    assert not set(EXPECTED) - keys, f"EXPECTED names URLs that no longer exist: {set(EXPECTED) - keys}"


CASES = [(name, key) for name in sorted(EXPECTED) for key in ("", " shared") if f"GET{key}" in EXPECTED[name]]


def test_every_route_with_a_run_or_experiment_is_declared_for_shared_ones_too():
    for route, pattern in _routes():
        if pattern.name in EXPECTED and ("<int:run_id>" in route or "<slug:name>" in route):
            assert {"GET shared", "POST shared"} <= set(EXPECTED[pattern.name]), pattern.name


@pytest.mark.parametrize(("name", "visibility"), CASES)
def test_each_role_gets_the_declared_outcome(make_world, name, visibility):
    users, objects = make_world(shared=visibility == " shared")
    [route] = [r for r, p in _routes() if p.name == name and not r.startswith((API_PREFIX, ADMIN_PREFIX))]
    url = _url(route, objects)
    clients = {role: _client(users, role) for role in ROLES}
    for method in ("GET", "POST"):
        outcomes = tuple(_outcome(_request(clients[role], method, url)) for role in ROLES)
        expected = EXPECTED[name][method + visibility]
        assert outcomes == expected, f"{method} {url}: {dict(zip(ROLES, outcomes, strict=True))}"


def _fillable(routes: list[str], objects: dict) -> list[str]:
    urls = []
    for route in routes:
        try:
            urls.append(_url(route, objects))
        except AssertionError:
            continue  # e.g. an admin route of a regular expression: the prefix rule holds all the same
    return urls


@pytest.mark.parametrize("prefix", [API_PREFIX, ADMIN_PREFIX])
def test_the_api_gives_anonymous_no_data_and_the_admin_admits_only_staff(world, prefix):
    users, objects = world
    routes = [r for r, _ in _routes() if r.startswith(prefix)]
    if prefix == ADMIN_PREFIX:  # every admin page has the same guard: its index, login and the run pages
        routes = [r for r in routes if r in ("admin/", "admin/login/") or r.startswith("admin/webapp/run/")]
    urls = _fillable(routes, objects | {"object_id": objects["run_id"]})
    assert urls
    clients = {role: _client(users, role) for role in ROLES}
    for url in urls:
        for method in ("GET", "POST"):
            outcomes = {role: _outcome(_request(clients[role], method, url)) for role in ROLES}
            assert 500 not in outcomes.values(), (method, url, outcomes)
            if prefix == API_PREFIX:
                assert outcomes["anonymous"] in (401, 403, 405), (method, url, outcomes)
                if f"/runs/{objects['run_id']}" in url:  # the owner's private run
                    assert outcomes["other"] in (403, 404, 405) and outcomes["noperm"] in (403, 404, 405), (
                        method, url, outcomes,
                    )  # fmt: skip
            else:
                allowed = (L, 302, 404, 405) + ((200,) if url in ADMIN_PUBLIC else ())
                assert all(outcomes[r] in allowed for r in ROLES if r != "staff"), (method, url, outcomes)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("shared", "accepted"), [(False, SOCKET_PRIVATE), (True, SOCKET_SHARED)])
async def test_the_run_socket_admits_only_those_who_may_see_the_run(make_world, shared, accepted):
    from asgiref.sync import sync_to_async

    users, objects = await sync_to_async(make_world)(shared)
    paths = [SOCKET.format(run_id=objects["run_id"]), "/ws/runs/abc/", "/ws/other/"]
    seen = {}
    for role in ROLES:
        headers = [(b"origin", b"http://127.0.0.1:8000")]
        if role != "anonymous":
            client = await sync_to_async(_client)(users, role)
            headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
        for path in paths:
            communicator = WebsocketCommunicator(application, path, headers=headers)
            connected, _ = await communicator.connect(timeout=10)
            seen[role, path] = connected
            await communicator.disconnect()
    assert tuple(seen[role, paths[0]] for role in ROLES) == accepted
    assert not any(seen[role, path] for role in ROLES for path in paths[1:])  # refused, never a 500
