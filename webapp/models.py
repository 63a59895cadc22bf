from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class RunQuerySet(models.QuerySet):
    def visible_to(self, user) -> RunQuerySet:
        """Runs a user may see: their own, shared ones, or all for staff."""
        if user.is_staff:
            return self
        return self.filter(Q(owner=user) | Q(shared=True))

    def active(self) -> RunQuerySet:
        return self.filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING])


class Run(models.Model):
    """One training run: its configuration, its state, and who owns it."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    shared = models.BooleanField(default=False, help_text="Visible to every user, not just the owner.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    method = models.CharField(max_length=32, default="grpo")
    env = models.CharField(max_length=100, default="MiniHack-Room-5x5")
    config = models.JSONField(default=dict)
    seed = models.IntegerField(default=0)
    step = models.IntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"
