"""A refused request as one shape for every 422: ``{"detail": "<key>: <why>; ...", "errors": {key: [why]}}``,
keyed by what the caller wrote (a parameter, a body key, ``body`` for the body as a whole)."""

from __future__ import annotations

from typing import Any

BODY = "body"


def _key(loc: tuple | list) -> str:
    """``("query", "offset")`` -> ``offset``; ``("body", "body", "tags", 0)`` -> ``tags.0``; the whole body
    -> ``body``. After the source, a body's location names the operation's body parameter, not a key."""
    source, *rest = loc
    if source == BODY:
        rest = rest[1:]
    return ".".join(str(part) for part in rest) or BODY


def _message(error: dict[str, Any], key: str) -> str:
    # pydantic's messages read well, except these two (about its models, not about what was sent)
    if key == BODY and error["type"] in ("missing", "model_attributes_type"):
        return "send a JSON object"
    return "unknown key" if error["type"] == "extra_forbidden" else error["msg"]


def refusal(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """Ninja's validation errors as the API's 422 body."""
    by_key: dict[str, list[str]] = {}
    for error in errors:
        key = _key(error["loc"])
        by_key.setdefault(key, []).append(_message(error, key))
    detail = "; ".join(f"{key}: {', '.join(messages)}" for key, messages in by_key.items())
    return {"detail": detail, "errors": by_key}
