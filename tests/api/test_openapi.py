"""The served OpenAPI schema is valid OpenAPI and documents every endpoint; schema and docs need a login."""

from __future__ import annotations

import json

import pytest
from openapi_spec_validator import validate

from tests.api.conftest import bearer

pytestmark = pytest.mark.django_db


def _refusing_repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """Swagger UI parses the document as YAML, which refuses a key written twice; so does this."""
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), sorted(key for key in keys if keys.count(key) > 1)
    return dict(pairs)


def test_the_served_schema_is_valid_openapi_and_lists_the_endpoints(client, user):
    index = client.get("/api/v1/", headers=bearer(user, "read")).json()
    assert index["user"] == "alice" and not index["can_write"] and index["docs"] == "/api/v1/docs"
    response = client.get(index["openapi"], headers=bearer(user, "read"))
    assert response.status_code == 200
    schema = json.loads(response.content, object_pairs_hook=_refusing_repeated_keys)
    validate(schema)
    paths = schema["paths"]
    run = "/api/v1/runs/{run_id}"
    tails = ["metrics", "metrics/rows", "episodes", "bank", "bank/{entry_id}", "clone", "resume", "cancel"]
    for path in ["/api/v1/runs", run, *(f"{run}/{tail}" for tail in tails)]:
        assert path in paths, path
    assert set(paths["/api/v1/runs"]) == {"get", "post"}
    assert {"TokenAuth", "BrowserSessionAuth"} <= set(schema["components"]["securitySchemes"])


def test_the_docs_page_loads_its_scripts_from_this_site_and_needs_a_login(client, user):
    assert client.get("/api/v1/docs").status_code == 401
    assert client.get("/api/v1/openapi.json").status_code == 401
    client.force_login(user)
    page = client.get("/api/v1/docs").content.decode()
    assert "swagger-ui-bundle.js" in page and "cdn" not in page.lower()
