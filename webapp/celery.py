"""The Celery app. Broker: Redis; results: PostgreSQL (django-celery-results).

Two queues: ``training`` for training runs (one run per worker slot) and ``default`` for light
tasks. Start a worker with ``celery -A webapp worker -Q training,default``.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
