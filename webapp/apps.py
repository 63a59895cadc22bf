import logging
from functools import partial

from django.apps import AppConfig
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save

from webapp.events import access_changed, close_session_sockets, run_group, user_group

log = logging.getLogger(__name__)


class WebappConfig(AppConfig):
    name = "webapp"
    verbose_name = "Complementary RL Studio"

    def ready(self) -> None:
        user_logged_out.connect(_close_sockets_on_logout, dispatch_uid="webapp-close-sockets-on-logout")
        for model, fields in (
            (self.get_model("Run"), RUN_ACCESS_FIELDS),
            (get_user_model(), USER_ACCESS_FIELDS),
        ):
            handler = partial(_recheck_sockets, fields=fields)
            for signal in (post_save, post_delete):
                uid = f"webapp-recheck-{model.__name__}-{id(signal)}"
                signal.connect(handler, sender=model, weak=False, dispatch_uid=uid)


RUN_ACCESS_FIELDS = frozenset({"owner", "owner_id", "shared"})
USER_ACCESS_FIELDS = frozenset({"is_active", "is_staff", "is_superuser", "password"})
"""Fields that decide who may watch a run; a save that names only other fields (a heartbeat, a login's
``last_login``) leaves the live sockets alone."""


def _recheck_sockets(sender, instance, fields, update_fields=None, created=False, **kwargs) -> None:
    """A run or a user changed in a way that may take a viewer's access away: the sockets it concerns check
    now (they also check every ``SOCKET_ACCESS_RECHECK_S``, for changes made behind the ORM's back)."""
    if created or (update_fields is not None and not fields & set(update_fields)):
        return
    group = user_group(instance.pk) if sender is get_user_model() else run_group(instance.pk)
    try:
        access_changed(group)
    except Exception:  # noqa: BLE001 - the save must succeed when Redis is down; the periodic check remains
        log.warning("could not tell the live sockets that access changed", exc_info=True)


def _close_sockets_on_logout(sender, request, user, **kwargs) -> None:
    """A logout ends the live streams opened with that session (they re-check access per event as well)."""
    try:
        close_session_sockets(request.session.session_key)
    except Exception:  # noqa: BLE001 - the logout must succeed even when Redis is down
        log.warning("could not close the live sockets of a logged-out session", exc_info=True)
