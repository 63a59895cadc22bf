"""Who is calling the API: a personal access token (``Authorization: Bearer crs_...``) or the browser's
session (with Django's CSRF check on writes), and how often they may call."""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, JsonResponse
from ninja.errors import AuthorizationError
from ninja.security import HttpBearer, SessionAuth
from ninja.throttling import SimpleRateThrottle

from api.models import AccessToken
from api.tokens import token_for_secret

CACHE_ALIAS = "api"
"""The cache (Redis, shared by every web process) that counts requests for the rate limit."""


@dataclass(frozen=True)
class Caller:
    """The user behind a request and what they may do through the API."""

    user: Any
    can_write: bool
    token: AccessToken | None = None


class TokenAuth(HttpBearer):
    """A personal access token in the Authorization header."""

    def authenticate(self, request: HttpRequest, token: str) -> Caller | None:
        access = token_for_secret(token)
        if access is None:
            return None
        request.user = access.user
        return Caller(access.user, access.can_write, access)


class BrowserSessionAuth(SessionAuth):
    """The logged-in browser session; unsafe methods need the CSRF token (``X-CSRFToken``), as forms do.
    A request that carries an Authorization header is judged by it alone, never by a cookie beside it."""

    def __call__(self, request: HttpRequest) -> Caller | None:
        # no session to judge: 401 as for every anonymous call, not the CSRF check's 403 that ninja's
        # SessionAuth answers first for an unsafe method
        if request.headers.get("Authorization") or not request.user.is_authenticated:
            return None
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, key: str | None) -> Caller | None:
        user = super().authenticate(request, key)
        return Caller(user, can_write=True) if user is not None else None


AUTH = [TokenAuth(), BrowserSessionAuth()]


def caller(request: HttpRequest) -> Caller:
    return request.auth  # type: ignore[attr-defined]


def writing_caller(request: HttpRequest) -> Caller:
    """The caller, if they may change things (a session, or a read-write token); else 403."""
    who = caller(request)
    if not who.can_write:
        raise AuthorizationError(message="this token may only read; create a read-write token to do this")
    return who


class CallerThrottle(SimpleRateThrottle):
    """At most ``settings.STUDIO_API_RATE`` requests per user (their tokens and session together), counted in
    the ``api`` cache; beyond it the API answers 429 with Retry-After."""

    scope = "studio-api"

    def __init__(self) -> None:
        super().__init__(rate=settings.STUDIO_API_RATE)

    @property
    def cache(self):  # looked up per request: the cache settings may change (tests)
        return caches[CACHE_ALIAS]

    def allow_request(self, request: HttpRequest) -> bool:
        self.num_requests, self.duration = self.parse_rate(settings.STUDIO_API_RATE)
        return super().allow_request(request)

    def get_cache_key(self, request: HttpRequest) -> str:
        return self.cache_format % {"scope": self.scope, "ident": caller(request).user.pk}


def signed_in(view):
    """For the schema and docs pages: a token or a session, else 401 (never a redirect to the login page)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any):
        if any(auth(request) for auth in AUTH):
            return view(request, *args, **kwargs)
        return JsonResponse({"detail": "Unauthorized"}, status=401, headers={"WWW-Authenticate": "Bearer"})

    return wrapper
