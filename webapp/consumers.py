from __future__ import annotations

import time
from functools import partial
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare
from django.utils.module_loading import import_string

from webapp.events import run_group, session_group, user_group
from webapp.selectors import metric_rows_since, run_visible

SessionStore = import_string(f"{settings.SESSION_ENGINE}.SessionStore")
FORBIDDEN = 4403
NOT_FOUND = 4404

in_db_thread = partial(database_sync_to_async, thread_sensitive=False)
"""The sockets' database reads run in the event loop's thread pool, not in the one thread that serves every
synchronous request: an event is never held up behind a slow page."""


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Streams a run's live events. Anonymous users and users who may not see the run are refused.

    ``?since=<metric row id>`` (the cursor the page was rendered with) makes the socket first replay the rows
    written after it, so a late subscriber misses nothing; it joins the group before reading them, so an
    event may arrive twice (browsers drop steps they already have) but never not at all.

    Access is checked again (the session must still be logged in as the same user, and the run still
    visible to them) before the first event forwarded after ``SOCKET_ACCESS_RECHECK_S``, and at once when
    the product changes the run's sharing or the user's rights (``access_changed``); a logout closes the
    socket at once (``session_group``). A run made private, or a session that ended, stops the stream.
    """

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if user is None or not await in_db_thread(run_visible)(user, self.run_id):
            await self.close(code=FORBIDDEN)  # before accept(): the handshake is refused
            return
        self.session_key = self.scope["session"].session_key
        self.groups_joined = [run_group(self.run_id), session_group(self.session_key), user_group(user.pk)]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self.checked_at, self.refused = time.monotonic(), False
        await self.accept()
        since = parse_qs(self.scope.get("query_string", b"").decode()).get("since", [""])[0]
        if since.isdigit():
            for event in await in_db_thread(metric_rows_since)(self.run_id, int(since)):
                await self.send_json(event)

    async def disconnect(self, code: int) -> None:
        await self._leave_groups()

    async def _leave_groups(self) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    async def _refuse(self) -> None:
        """Closes the socket and forwards nothing more, even events already queued for it."""
        self.refused = True
        await self._leave_groups()
        await self.close(code=FORBIDDEN)

    async def run_event(self, message: dict) -> None:
        if self.refused:
            return
        if time.monotonic() - self.checked_at >= settings.SOCKET_ACCESS_RECHECK_S:
            if not await self._check_access():
                return
        await self.send_json(message["event"])

    async def access_changed(self, message: dict) -> None:
        await self._check_access()

    async def _check_access(self) -> bool:
        """Closes the socket unless its viewer may still watch the run."""
        if self.refused or not await in_db_thread(self._still_allowed)():
            await self._refuse()
            return False
        self.checked_at = time.monotonic()
        return True

    async def session_ended(self, message: dict) -> None:
        await self._refuse()

    def _still_allowed(self) -> bool:
        """The socket's session is still logged in as its user, who is still active and may still see the
        run (fresh reads of the session and the user: staff rights may have been taken away)."""
        session = SessionStore(self.session_key)
        if str(session.get(SESSION_KEY, "")) != str(self.scope["user"].pk):
            return False
        user = get_user_model().objects.filter(pk=self.scope["user"].pk, is_active=True).first()
        if user is None or not constant_time_compare(
            session.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash()
        ):
            return False  # as Django's own login check: a password change ends the user's other sessions
        return run_visible(user, self.run_id)


class UnknownSocket(AsyncWebsocketConsumer):
    """Any other WebSocket path: refused with a code, not a server error."""

    async def connect(self) -> None:
        await self.close(code=NOT_FOUND)
