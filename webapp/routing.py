from django.urls import path, re_path

from webapp.consumers import RunConsumer, UnknownSocket

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
    re_path(r"^", UnknownSocket.as_asgi()),  # e.g. /ws/runs/abc/: refused (4404), never a 500
]
