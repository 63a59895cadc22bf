"""Personal access tokens: a user's keys to the REST API, stored as a hash, each read-only or read-write."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class AccessTokenQuerySet(models.QuerySet):
    def usable(self) -> AccessTokenQuerySet:
        """Not revoked, not expired, and their user still active."""
        now = timezone.now()
        return self.filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True, user__is_active=True
        )


class AccessToken(models.Model):
    """One personal access token. Only the SHA-256 of the secret is kept: it is shown once, at creation."""

    class Scope(models.TextChoices):
        READ = "read", "read: list and read runs, metrics, episodes and banks"
        READ_WRITE = "read-write", "read-write: also launch, clone, resume and cancel runs"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens")
    name = models.CharField(max_length=100, help_text="What it is for, e.g. 'sweep script on gpu-2'.")
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.READ)
    digest = models.CharField(max_length=64, unique=True, help_text="sha256 hex of the whole secret.")
    hint = models.CharField(max_length=16, help_text="The secret's first characters, to recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = AccessTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…, {self.scope})"

    @property
    def can_write(self) -> bool:
        return self.scope == self.Scope.READ_WRITE
