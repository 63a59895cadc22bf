"""Settings for the daphne server the browser tests start: the project's, with static files served from
the source folders (no collectstatic in tests)."""

import os

from webapp.settings import *  # noqa: F403
from webapp.settings import STORAGES

STORAGES = STORAGES | {"staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True

# Launched runs go to a queue of the test's own (no worker trains rows of a test database by accident).
CELERY_TASK_ROUTES = {
    "webapp.tasks.train_run": {"queue": os.environ.get("E2E_TRAINING_QUEUE", "e2e-training")}
}
