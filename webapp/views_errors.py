"""Error pages that must not need the database: they answer when it is what failed."""

from __future__ import annotations

import sys

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from psycopg_pool import PoolTimeout

RETRY_AFTER_S = 5
"""What a busy server asks a client to wait before trying again (a pool waits seconds, not minutes)."""
BUSY = "The server is busy right now (every database connection is in use). Try again in a few seconds."


def pool_exhausted(exc: BaseException | None) -> bool:
    """True if ``exc`` (Django wraps the driver's errors) is a connection pool that had none free in time."""
    while exc is not None:
        if isinstance(exc, PoolTimeout):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: a full pool is a 503 with ``Retry-After`` (the request did nothing), anything else
    Django's 500."""
    if not pool_exhausted(sys.exc_info()[1]):
        return defaults.server_error(request)
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": BUSY}, status=503)
    else:
        page = f"<!doctype html><title>Busy</title><h1>Busy</h1><p>{BUSY}</p><p><a href=''>Reload</a></p>"
        response = HttpResponse(page, status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response
