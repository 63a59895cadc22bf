import logging

from django.apps import AppConfig

log = logging.getLogger(__name__)


class WebappConfig(AppConfig):
    name = "webapp"
    verbose_name = "Complementary RL Studio"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        user_logged_out.connect(_close_sockets_on_logout, dispatch_uid="webapp-close-sockets-on-logout")


def _close_sockets_on_logout(sender, request, user, **kwargs) -> None:
    """A logout ends the live streams opened with that session (they re-check access per event as well)."""
    from webapp.events import close_session_sockets

    try:
        close_session_sockets(request.session.session_key)
    except Exception:  # noqa: BLE001 - the logout must succeed even when Redis is down
        log.warning("could not close the live sockets of a logged-out session", exc_info=True)
