"""Creating, finding and revoking personal access tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.shortcuts import get_object_or_404
from django.utils import timezone

from api.models import AccessToken

TOKEN_PREFIX = "crs_"
"""Every secret starts with this, so a leaked one is easy to recognise (and to scan for)."""
HINT_CHARS = 8
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""``last_used_at`` is written at most this often per token (one UPDATE, not one per request)."""


def token_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_create(user, name: str, scope: str, expires_in_days: int | None = None) -> tuple[AccessToken, str]:
    """A new token and its secret. The secret is returned only here: just its hash is stored."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
    token = AccessToken.objects.create(
        user=user,
        name=name,
        scope=scope,
        digest=token_digest(secret),
        hint=secret[: len(TOKEN_PREFIX) + HINT_CHARS],
        expires_at=expires_at,
    )
    return token, secret


def token_for_secret(secret: str) -> AccessToken | None:
    """The usable token with this secret (and its user), or None; notes when it was last used."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    token = AccessToken.objects.usable().select_related("user").filter(digest=token_digest(secret)).first()
    if token is not None:
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            AccessToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def token_revoke(user, token_id: int) -> AccessToken:
    """Revoke one of ``user``'s tokens (others' tokens do not exist for them: 404)."""
    token = get_object_or_404(AccessToken, pk=token_id, user=user)
    AccessToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


def token_list(user) -> list[AccessToken]:
    """The user's tokens that are not revoked (expired ones too, marked by their date)."""
    return list(AccessToken.objects.filter(user=user, revoked_at__isnull=True))
