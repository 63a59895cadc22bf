from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.db import DatabaseError
from django.utils.crypto import constant_time_compare
from django.utils.module_loading import import_string

from experience import strict_json
from webapp import sockets
from webapp.events import run_group, session_group, user_group
from webapp.selectors import metric_rows_since, run_visible
from webapp.views_errors import pool_exhausted

log = logging.getLogger(__name__)
SessionStore = import_string(f"{settings.SESSION_ENGINE}.SessionStore")
FORBIDDEN = 4403
NOT_FOUND = 4404
TOO_MANY_SOCKETS = 4429
TRY_AGAIN_LATER = 1013
UNSUPPORTED_DATA = 1003
INVALID_PAYLOAD = 1007
OVER_CAP = "too many live pages open: close some tabs"
BUSY = "live updates are busy: retrying"

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

    Each user may hold ``STUDIO_SOCKETS_PER_USER`` open sockets, counted on every web server
    (``webapp.sockets``). The page sends nothing: a JSON text frame is ignored, anything else closes.

    Close codes (the run page's script says the 44xx ones to the user and does not reconnect after them):

    - 4403: may not see the run: at the handshake (refused before accept, so browsers see 1006), or later
      when access was taken away or the session ended;
    - 4404: no such socket path (``UnknownSocket``);
    - 4429: the user already has ``STUDIO_SOCKETS_PER_USER`` sockets open (sent after accept, with a reason,
      so the page can tell the user to close some tabs);
    - 1013 (try again later): Redis, the channel layer, failed or stayed busy, or no database connection
      was free in time (``STUDIO_DB_POOL_TIMEOUT``); the page reconnects later;
    - 1003 (unsupported data): a binary frame; 1007 (invalid payload): a text frame that is not JSON.
    """

    closing = refused = holds_slot = False
    slot_keeper: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        """A channel-layer failure, or a database read that found every connection of the process's pool in
        use, anywhere in the socket's life (its receive loop included) closes it with 1013, never a 500 at
        the handshake or an ASGI error later."""
        try:
            await super().__call__(scope, receive, send)
        except sockets.LAYER_ERRORS:
            log.warning("run socket closed: the channel layer failed", exc_info=True)
            await self._give_up()
        except DatabaseError as exc:
            if not pool_exhausted(exc):
                raise
            log.warning("run socket closed: no database connection was free in time")
            await self._give_up()
        finally:
            if self.slot_keeper is not None:  # cancelled (the server stops): the slot lapses on its own
                self.slot_keeper.cancel()

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if user is None or not await in_db_thread(run_visible)(user, self.run_id):
            await self.close(code=FORBIDDEN)  # before accept(): the handshake is refused
            return
        try:
            # the groups are joined before the handshake completes: a change of access made as soon as the
            # client sees the socket open (a password change, a run made private) reaches this socket
            self.holds_slot = await self._hold_slot()
            if self.holds_slot:
                await self._join_groups(user)
        except sockets.LAYER_ERRORS:
            log.warning("run socket refused: the channel layer failed", exc_info=True)
            await self.accept()  # a browser reads no code on a refused handshake
            await self._give_up()
            return
        await self.accept()  # before the over-cap refusal, which the page must read
        if not self.holds_slot:
            await self.close(code=TOO_MANY_SOCKETS, reason=OVER_CAP)
            return
        self.slot_keeper = asyncio.create_task(self._keep_slot())
        since = parse_qs(self.scope.get("query_string", b"").decode()).get("since", [""])[0]
        if since.isdigit():
            for event in await in_db_thread(metric_rows_since)(self.run_id, int(since)):
                await self.send_json(event)

    async def _join_groups(self, user) -> None:
        self.session_key = self.scope["session"].session_key
        self.groups_joined = [run_group(self.run_id), session_group(self.session_key), user_group(user.pk)]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self.checked_at = time.monotonic()

    async def disconnect(self, code: int) -> None:
        await self._let_go()

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        """Closes once: a second close frame (a refusal racing a client's garbage) would be an ASGI error."""
        if not self.closing:
            self.closing = True
            await super().close(code=code, reason=reason)

    async def _give_up(self) -> None:
        await self.close(code=TRY_AGAIN_LATER, reason=BUSY)
        try:
            await self._let_go()
        except sockets.LAYER_ERRORS:
            pass  # Redis is the trouble: the slot lapses and the group memberships expire on their own

    async def _let_go(self) -> None:
        """Leaves the groups and frees the user's slot (the socket is closing)."""
        if self.slot_keeper is not None:
            self.slot_keeper.cancel()
            self.slot_keeper = None
        await self._leave_groups()
        if self.holds_slot:
            self.holds_slot = False  # first: a failed release is not tried again, the slot lapses instead
            await sockets.release_slot(self._slots(), *self._slot_of())

    # ---- the user's socket slot (webapp.sockets) --------------------------------------------------
    def _slots(self):
        return self.channel_layer.connection(0)  # the layer's pool: bounded, and per event loop

    def _slot_of(self) -> tuple[str, int, str]:
        return self.channel_layer.prefix, self.scope["user"].pk, self.channel_name

    async def _hold_slot(self) -> bool:
        return await sockets.hold_slot(self._slots(), *self._slot_of())

    async def _keep_slot(self) -> None:
        """Renews the slot while the socket is open; a slot that lapsed meanwhile (the server stalled) and
        whose place another socket took closes this one as over the cap."""
        while True:
            await asyncio.sleep(settings.SOCKET_SLOT_TTL_S / 3)
            try:
                held = await self._hold_slot()
            except sockets.LAYER_ERRORS:
                log.warning("could not renew a run socket's slot", exc_info=True)
                continue
            if not held:
                self.holds_slot = False
                await self._refuse(TOO_MANY_SOCKETS, OVER_CAP)
                return

    # ---- frames from the client ------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        """The page sends nothing; a client that sends something it cannot mean gets a close code, never an
        exception (which dropped the socket with no code at all)."""
        if text_data is None:
            await self.close(code=UNSUPPORTED_DATA, reason="binary frames are not supported")
            return
        try:
            strict_json.loads(text_data)
        except ValueError:
            await self.close(code=INVALID_PAYLOAD, reason="frames must be JSON")

    async def _leave_groups(self) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    async def _refuse(self, code: int = FORBIDDEN, reason: str | None = None) -> None:
        """Closes the socket and forwards nothing more, even events already queued for it."""
        self.refused = True
        await self._leave_groups()
        await self.close(code=code, reason=reason)

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


class BusyDatabaseGuard:
    """ASGI middleware over the socket stack: a handshake whose session or user could not be read because
    every database connection of the process was in use (``views_errors.pool_exhausted``) is refused, not
    answered with a 500; the page reconnects later. The consumer handles its own reads (``RunConsumer``)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send) -> None:
        sent = []

        async def sending(message: dict) -> None:
            sent.append(message["type"])
            await send(message)

        try:
            await self.inner(scope, receive, sending)
        except DatabaseError as exc:
            if not pool_exhausted(exc) or "websocket.close" in sent:
                raise
            log.warning("run socket refused: no database connection was free in time")
            await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": BUSY})


class UnknownSocket(AsyncWebsocketConsumer):
    """Any other WebSocket path: refused with a code, not a server error."""

    async def connect(self) -> None:
        await self.close(code=NOT_FOUND)
