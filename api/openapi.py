"""The statuses every operation can answer besides its own, written into the OpenAPI document so that it
tells the truth (an outside fuzzer, Schemathesis, checks it in the suite: tests/api/test_schemathesis.py).

- 401: no valid token or session (every operation);
- 400: a write whose body is not readable JSON;
- 403: a caller without the permission, or a read-only token, on a write;
- 404: a run, entry or other object of the path that does not exist or is not the caller's to see;
- 415: a write whose body is not JSON;
- 422: a parameter or body the operation does not take as written (``{detail, errors}``);
- 429: the caller's rate limit (``Retry-After``);
- 503: the database's connections are all in use for longer than a request waits (``Retry-After``).

And every string parameter says it takes no control character (``webapp.middleware`` refuses them at the
door with 422, for every operation).
"""

from __future__ import annotations

from typing import Any

ERROR = {"$ref": "#/components/schemas/Error"}
REFUSED = {"$ref": "#/components/schemas/Refused"}
RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}
}
COMMON: dict[str, tuple[str, dict, dict]] = {
    "401": ("No valid token or session: sign in, or send `Authorization: Bearer crs_...`.", ERROR, {}),
    "422": ("A parameter or body the operation does not take as written.", REFUSED, {}),
    "429": ("Too many requests from this caller: wait Retry-After seconds.", ERROR, RETRY_AFTER),
    "503": ("The server is busy (no database connection came free in time): retry after Retry-After.", ERROR,
            RETRY_AFTER),
}  # fmt: skip
WRITES: dict[str, tuple[str, dict, dict]] = {
    "400": ("The body is not readable JSON (malformed, NaN, a repeated key, too deep).", ERROR, {}),
    "403": ("The caller may not do this (a permission, or a read-only token).", ERROR, {}),
    "415": ("The body is not JSON (send Content-Type: application/json).", ERROR, {}),
}
WITH_PATH_IDS = {"404": ("No such object, or not one the caller may see.", ERROR, {})}
NO_CONTROL_CHARACTERS = "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]*$"
"""``webapp.middleware.CONTROL``, negated: what a string parameter may hold."""


def document_common_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the statuses above to every operation of ``schema`` (an operation's own description of a status
    is kept); the Refused body joins the components if no operation names it."""
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            extra = dict(COMMON)
            if method.lower() in ("post", "put", "patch", "delete"):
                extra |= WRITES
            if "{" in path:
                extra |= WITH_PATH_IDS
            for parameter in operation.get("parameters", []):
                _no_control_characters(parameter.get("schema", {}))
            responses = operation.setdefault("responses", {})
            described = {str(status) for status in responses}  # ninja keys its own statuses by int
            for status, (description, body, headers) in extra.items():
                if str(status) not in described:
                    responses[status] = _response(description, body, headers)
    return schema


def _response(description: str, body: dict, headers: dict) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": body}}}
    if headers:
        response["headers"] = headers
    return response


def _no_control_characters(schema: dict[str, Any]) -> None:
    if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema:
        schema["pattern"] = NO_CONTROL_CHARACTERS
    for option in schema.get("anyOf", []):
        _no_control_characters(option)
