from __future__ import annotations

from functools import partial
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.utils.module_loading import import_string

from webapp.events import run_group, session_group
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

    Access is checked again before every event it forwards (the session must still be logged in as the same
    user, and the run still visible to them), and a logout closes the socket at once (``session_group``):
    a run made private, or a session that ended, stops the stream.
    """

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if user is None or not await in_db_thread(run_visible)(user, self.run_id):
            await self.close(code=FORBIDDEN)  # before accept(): the handshake is refused
            return
        self.group = run_group(self.run_id)
        self.session_key = self.scope["session"].session_key
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(session_group(self.session_key), self.channel_name)
        await self.accept()
        since = parse_qs(self.scope.get("query_string", b"").decode()).get("since", [""])[0]
        if since.isdigit():
            for event in await in_db_thread(metric_rows_since)(self.run_id, int(since)):
                await self.send_json(event)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await self.channel_layer.group_discard(session_group(self.session_key), self.channel_name)

    async def run_event(self, message: dict) -> None:
        if not await in_db_thread(self._still_allowed)():
            await self.close(code=FORBIDDEN)
            return
        await self.send_json(message["event"])

    async def session_ended(self, message: dict) -> None:
        await self.close(code=FORBIDDEN)

    def _still_allowed(self) -> bool:
        """The socket's session is still logged in as its user, who may still see the run."""
        user = self.scope["user"]
        session = SessionStore(self.session_key)  # a fresh read of the stored session
        if str(session.get(SESSION_KEY, "")) != str(user.pk):
            return False
        return run_visible(user, self.run_id)


class UnknownSocket(AsyncWebsocketConsumer):
    """Any other WebSocket path: refused with a code, not a server error."""

    async def connect(self) -> None:
        await self.close(code=NOT_FOUND)
