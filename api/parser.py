"""Request bodies read as strict JSON (RFC 8259): what Python's ``json`` would also take is refused."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object; a key given twice is refused (Python would keep the last silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("an object repeats a key")
    return obj


class StrictJSONParser(Parser):
    """NaN, Infinity and repeated keys make a body unreadable (400), like any other malformed JSON."""

    def parse_body(self, request: HttpRequest) -> Any:
        return json.loads(request.body, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
