from __future__ import annotations

from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.events import run_group
from webapp.selectors import metric_rows_since, run_visible


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Streams a run's live events. Anonymous users and users who may not see the run are refused.

    ``?since=<metric row id>`` (the cursor the page was rendered with) makes the socket first replay the rows
    written after it, so a late subscriber misses nothing; it joins the group before reading them, so an
    event may arrive twice (browsers drop steps they already have) but never not at all.
    """

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if user is None or not await database_sync_to_async(run_visible)(user, self.run_id):
            await self.close(code=4403)  # before accept(): the handshake is refused
            return
        self.group = run_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        since = parse_qs(self.scope.get("query_string", b"").decode()).get("since", [""])[0]
        if since.isdigit():
            for event in await database_sync_to_async(metric_rows_since)(self.run_id, int(since)):
                await self.send_json(event)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_event(self, message: dict) -> None:
        await self.send_json(message["event"])
