"""Settings for the daphne server the browser tests start: the project's, with static files served from
the source folders (no collectstatic in tests)."""

from webapp.settings import *  # noqa: F403
from webapp.settings import STORAGES

STORAGES = STORAGES | {"staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
