"""An outside fuzzer against the API: Schemathesis generates requests from the served OpenAPI document, for
every operation, and runs all of its checks on each answer (no server error, every status and body
documented, schema-valid requests accepted and invalid ones refused, auth not ignored ...). The writes go
to runs of a throwaway user, queued nowhere (``webapp.queueing._enqueue`` replaced).

One check is left out where it cannot hold: ``positive_data_acceptance`` on the launch operations (POST
/runs, /runs/{id}/clone, /plan). A launch is judged by the launch form and the plan after the schema (k even,
the plan fitting a worker's memory, a base config's own rules), which no JSON Schema can state: a
schema-valid launch may be refused with 422 and its reasons, as the schema says. Likewise an import's file
(POST /runs/{id}/imports) is judged line by line by the importer: any bytes are a schema-valid file.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.api.conftest import bearer

pytestmark = pytest.mark.django_db(transaction=True)  # requests run through the WSGI app's own connections
APP = get_wsgi_application()
JUDGED_AFTER_THE_SCHEMA = {("POST", "/api/v1/runs"), ("POST", "/api/v1/runs/{run_id}/clone"),
                           ("POST", "/api/v1/plan"), ("POST", "/api/v1/runs/{run_id}/imports")}  # fmt: skip
EXAMPLES = 12
"""Generated requests per operation (and its explicit examples): the suite stays short."""


def _served_schema():
    """The document the API serves, called through the WSGI app in process. Built at collection, not in a
    fixture: Schemathesis' lazy fixture schema (``from_fixture``) renames pytest nodes through a private
    attribute that pytest 9.2 removed."""
    from api.endpoints import api  # the URL configuration, loaded once Django is set up

    loaded = schemathesis.openapi.from_dict(api.get_openapi_schema())
    loaded.app, loaded.location = APP, "/api/v1/openapi.json"
    return loaded


schema = _served_schema()


@pytest.fixture(autouse=True)
def queued_nowhere(monkeypatch):
    monkeypatch.setattr("webapp.queueing._enqueue", lambda run_id: None)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_the_openapi_document_says(case, launcher):
    excluded = [positive_data_acceptance] if (case.method, case.path) in JUDGED_AFTER_THE_SCHEMA else []
    case.call_and_validate(headers=bearer(launcher), base_url="http://testserver", excluded_checks=excluded)
