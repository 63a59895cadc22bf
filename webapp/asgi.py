"""ASGI entry point (daphne): HTTP through Django, WebSockets through Channels with session auth.

The server loads the embedding model in the background as it starts (``STUDIO_WARM_START``), so the first
search by meaning does not wait for it."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_asgi_app = get_asgi_application()  # before importing consumers: it sets up the app registry

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from experience.embedding import warm_up_in_background  # noqa: E402
from webapp.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
if settings.STUDIO_WARM_START:
    warm_up_in_background()
