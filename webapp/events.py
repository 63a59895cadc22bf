"""Live events for a run: one group per run, named here and nowhere else."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def session_group(session_key: str | None) -> str:
    """The sockets opened with one login session: a logout closes them (``webapp.apps``)."""
    return f"session-{session_key or 'none'}"


def user_group(user_id: int) -> str:
    """The sockets opened by one user: a change to the user's rights makes them check access again."""
    return f"user-{user_id}"


def access_changed(group: str) -> None:
    """Make every socket in ``group`` check its access now, not at its next periodic check."""
    async_to_sync(get_channel_layer().group_send)(group, {"type": "access.changed"})


def close_session_sockets(session_key: str | None) -> None:
    async_to_sync(get_channel_layer().group_send)(session_group(session_key), {"type": "session.ended"})


def broadcast_run_event(run_id: int, event: dict[str, Any]) -> None:
    """Send ``event`` to every socket watching the run (from any process, through Redis)."""
    async_to_sync(get_channel_layer().group_send)(run_group(run_id), {"type": "run.event", "event": event})
