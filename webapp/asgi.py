"""ASGI entry point: HTTP through Django, WebSockets through Channels with session auth.

The product's web server (``webapp.webserver``: uvicorn, each of its processes) serves ``served()``, which
also loads the embedding model in the background (``STUDIO_WARM_START``), so the first search by meaning does
not wait for it, and then settles what the process has loaded (``settle``). Every view and middleware is
synchronous, so a request runs its whole stack in one thread (``SyncStackASGIHandler``)."""

import gc
import os

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")


class SyncStackASGIHandler(ASGIHandler):
    """Django's ASGI handler, running the middleware stack and the view as Django's WSGI handler does: in one
    thread, entered once per request.

    Django's own handler runs an async-capable middleware in async mode whenever the one below it is async,
    and a ``MiddlewareMixin`` middleware in async mode calls each of its hooks through ``sync_to_async``: 21
    thread hops per request here instead of 3, and about 2 ms more CPU per request on a 2-core machine (an
    API call 8.3 ms instead of 6.4, a page 12.1 instead of 10.1: ``benchmarks/bench_request_cost.py``), on
    the one core that a process runs Python on."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponse:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


django.setup(set_prefix=False)
django_asgi_app = SyncStackASGIHandler()  # before importing consumers: it sets up the app registry

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from experience.embedding import warm_up_in_background  # noqa: E402
from webapp.consumers import BusyDatabaseGuard  # noqa: E402
from webapp.routing import websocket_urlpatterns  # noqa: E402

sockets = BusyDatabaseGuard(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
application = ProtocolTypeRouter({"http": django_asgi_app, "websocket": AllowedHostsOriginValidator(sockets)})


def settle() -> None:
    """Moves every object loaded so far (Django, its URL and template caches, the embedding model: ~560k) out
    of the garbage collector's sight (``gc.freeze``): a full collection then scans thousands of objects, not
    all of them, and no longer stops every request of the process for ~0.3 s every few hundred requests."""
    gc.collect()
    gc.freeze()


def served() -> ProtocolTypeRouter:
    """``application`` as a web-server process serves it (``uvicorn --factory webapp.asgi:served``): settled
    once the embedding model has loaded, or at once without a warm start."""
    if settings.STUDIO_WARM_START:
        warm_up_in_background(then=settle)
    else:
        settle()
    return application
