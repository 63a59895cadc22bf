"""Request bodies read as strict JSON (RFC 8259): what Python's ``json`` would also take is refused."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser

from experience import strict_json


class StrictJSONParser(Parser):
    """NaN, Infinity and repeated keys make a body unreadable (400), like any other malformed JSON."""

    def parse_body(self, request: HttpRequest) -> Any:
        return strict_json.loads(request.body)
