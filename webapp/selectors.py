"""Reads for views and consumers."""

from __future__ import annotations

from webapp.models import Run, RunQuerySet


def run_list(user) -> RunQuerySet:
    return Run.objects.visible_to(user).select_related("owner")


def run_visible(user, run_id: int) -> bool:
    return user.is_authenticated and Run.objects.visible_to(user).filter(pk=run_id).exists()
