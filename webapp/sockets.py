"""Live sockets in Redis: the channel layer's bounded connection pool, and each user's socket slots.

Every open run socket holds a slot: its channel name in two sorted sets, its user's and everyone's, scored
with the time its slot lapses (Redis' clock, the same for every web server). A socket renews its slot every
third of ``SOCKET_SLOT_TTL_S``; the slots of a web server that died lapse on their own, so a crash never
keeps a user out for longer than that. The per-user cap (``STUDIO_SOCKETS_PER_USER``) and the open-socket
gauge (``webapp.metrics``) both read these sets, so they count across every web-server process.
"""

from __future__ import annotations

import asyncio

import redis
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from redis.asyncio import BlockingConnectionPool

LAYER_ERRORS = (redis.RedisError, OSError, asyncio.TimeoutError)
"""What a channel layer (or slot) operation raises when Redis is down, too slow, or its pool stays busy."""


class PooledRedisChannelLayer(RedisChannelLayer):
    """channels_redis with a blocking pool: when all ``max_connections`` of a process are busy, an operation
    waits up to ``timeout`` s for one. redis-py's default pool raised ``MaxConnectionsError`` at its 100th
    connection instead, and a burst of socket handshakes answered 500."""

    def create_pool(self, index: int) -> BlockingConnectionPool:
        host = dict(self.hosts[index])
        return BlockingConnectionPool.from_url(host.pop("address"), **host)


_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000 "

HOLD_SLOT = (
    _NOW
    + """
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + ttl, ARGV[1])
  redis.call('EXPIRE', key, math.ceil(ttl))
end
return 1
"""
)
"""Claims a slot for socket ARGV[1] (or renews the one it holds) unless its user already holds ARGV[2]."""

COUNT_OPEN = _NOW + "return redis.call('ZCOUNT', KEYS[1], now, '+inf')"


def user_slots_key(prefix: str, user_id: int) -> str:
    return f"{prefix}:sockets:user:{user_id}"


def all_slots_key(prefix: str) -> str:
    return f"{prefix}:sockets"


async def hold_slot(conn, prefix: str, user_id: int, channel: str) -> bool:
    """Claims or renews ``channel``'s slot; False when its user already holds ``STUDIO_SOCKETS_PER_USER``."""
    keys = (user_slots_key(prefix, user_id), all_slots_key(prefix))
    cap, ttl_s = settings.STUDIO_SOCKETS_PER_USER, settings.SOCKET_SLOT_TTL_S
    return bool(await conn.eval(HOLD_SLOT, len(keys), *keys, channel, cap, ttl_s))


async def release_slot(conn, prefix: str, user_id: int, channel: str) -> None:
    async with conn.pipeline(transaction=False) as pipe:
        pipe.zrem(user_slots_key(prefix, user_id), channel).zrem(all_slots_key(prefix), channel)
        await pipe.execute()


def count_open(conn: redis.Redis, prefix: str) -> int:
    """Sockets open on every web server (slots not lapsed)."""
    return int(conn.eval(COUNT_OPEN, 1, all_slots_key(prefix)))
