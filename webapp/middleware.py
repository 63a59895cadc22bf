"""Query parameters holding control characters are refused at the door, for every page and API operation.

PostgreSQL cannot store or compare a NUL, and no form or filter of this product means one: a parameter that
holds a C0 control character (tab, line feed and carriage return aside) or DEL is answered 400 on a page and
422 (the API's ``{detail, errors}`` shape) on the API, naming the parameter, before any view runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse, JsonResponse

CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
WHY = "contains a control character"
API_PREFIX = "/api/"


def parameters_with_control_characters(request: HttpRequest) -> list[str]:
    """The query parameters (by name, escaped so that they can be shown) whose name or a value is refused."""
    return [
        key.encode("unicode_escape").decode()
        for key, values in request.GET.lists()
        if CONTROL.search(key) or any(CONTROL.search(value) for value in values)
    ]


class RefuseControlCharacters:
    """After authentication: an anonymous API call still gets the API's 401 first."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = parameters_with_control_characters(request)
        api = request.path.startswith(API_PREFIX)
        if not refused or (api and not _signed_in(request)):
            return self.get_response(request)
        if api:
            detail = "; ".join(f"{key}: {WHY}" for key in refused)
            return JsonResponse({"detail": detail, "errors": {key: [WHY] for key in refused}}, status=422)
        raise BadRequest(f"the parameter {refused[0]} {WHY}")


def _signed_in(request: HttpRequest) -> bool:
    return request.user.is_authenticated or bool(request.headers.get("Authorization"))
