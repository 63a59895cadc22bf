"""The Celery app. Broker: Redis; results: PostgreSQL (django-celery-results).

Two queues, each with workers of its own (``manage.py up`` starts one of each: ``worker_commands``):
``training`` for training runs (one run per worker slot, for hours) and ``default`` for light tasks (bank
imports, exports, previews), so that light work never waits behind runs. Start more workers with
``celery -A webapp worker -Q default`` (light work) or ``-Q training`` (a machine that trains).
"""

import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _trains_only() -> bool:
    """This worker consumes training queues only (``training``, or a test's ``<prefix>training``)."""
    queues = app.amqp.queues.consume_from or {}
    return bool(queues) and all(name.endswith("training") for name in queues)


@worker_process_init.connect
def _warm_start(**kwargs) -> None:
    """Each pool process loads the embedding model in the background as it starts (``STUDIO_WARM_START``),
    so its first bank task does not wait for it. In the pool process, not the parent: nothing that holds
    torch's threads is forked. Not in a worker that only trains: each run trains in a process of its own
    (``webapp.supervisor``) that loads what it needs, so an embedder here would only hold memory."""
    from django.conf import settings

    from experience.embedding import warm_up_in_background

    if settings.STUDIO_WARM_START and not _trains_only():
        warm_up_in_background()
