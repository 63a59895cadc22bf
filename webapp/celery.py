"""The Celery app. Broker: Redis; results: PostgreSQL (django-celery-results).

Two queues: ``training`` for training runs (one run per worker slot) and ``default`` for light
tasks. Start a worker with ``celery -A webapp worker -Q training,default``.
"""

import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _warm_start(**kwargs) -> None:
    """Each pool process loads the embedding model in the background as it starts (``STUDIO_WARM_START``),
    so its first bank task does not wait for it. In the pool process, not the parent: nothing that holds
    torch's threads is forked."""
    from django.conf import settings

    from experience.embedding import warm_up_in_background

    if settings.STUDIO_WARM_START:
        warm_up_in_background()
