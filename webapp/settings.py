"""Django settings. Everything comes from the environment, with safe production defaults.

Embedded PostgreSQL + pgvector and Redis are used unless ``DATABASE_URL`` / ``REDIS_URL`` are set.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url

from trainer.paths import var_dir
from webapp import dbpool, embedded

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once and kept in var/secret_key."""
    if key := os.environ.get("SECRET_KEY"):
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "django_htmx",
    "django_celery_results",
    "axes",
    "csp",
    "webapp",
    "experience",
    "ninja",  # serves the API docs' scripts as local static files (the CSP allows no CDN)
    "api",
    "django_prometheus",  # /metrics (webapp.metrics)
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first: times the whole request
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "webapp.middleware.RefuseControlCharacters",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a lockout into the lockout response
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# ---- database ------------------------------------------------------------------------------
# Every process holds a bounded pool of connections (webapp/dbpool.py: sizes by role), never persistent ones.
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=0)}
    if os.environ.get("STUDIO_DB_NAME"):  # a child process working on its parent's (e.g. test) database
        DATABASES["default"]["NAME"] = os.environ["STUDIO_DB_NAME"]
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("STUDIO_DB_NAME", embedded.DB_NAME),
            "USER": embedded.DB_USER,
            "HOST": str(embedded.pg_socket_dir()),
        }
    }
DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps connections; Django must hand them back each time
DATABASES["default"].setdefault("OPTIONS", {}).update(dbpool.database_options())
# Each test session gets a test database of its own (named after its process), so sessions can run side by
# side; STUDIO_TEST_DB names one instead.
TEST_DB_NAME = os.environ.get("STUDIO_TEST_DB") or f"test_{embedded.DB_NAME}_{os.getpid()}"
DATABASES["default"].setdefault("TEST", {})["NAME"] = TEST_DB_NAME
DATABASES["default"]["ENGINE"] = "django_prometheus.db.backends.postgresql"  # Django's, with counted queries
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ---- Redis: Celery broker and Channels layer -------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL") or embedded.embedded_redis_url()

CHANNEL_LAYER_READ_TIMEOUT_S = 60
"""A socket waits for its next event with a blocking Redis read that the server ends after 5 s
(channels_redis' BZPOPMIN). redis-py >= 6 also gives every read a 5 s client timeout by default, so each
idle socket raced the server's empty reply and lost whenever the server or the web server's event loop ran
a little late: a ``TimeoutError: Timeout reading from …`` and a dropped WebSocket. Reads get a timeout well
past the 5 s."""
CHANNEL_LAYER_CONNECTIONS = int(os.environ.get("STUDIO_CHANNEL_LAYER_CONNECTIONS", "100"))
"""Redis connections the channel layer of one web-server process holds at most. Its sockets share them (an
idle socket holds none; each operation borrows one for a moment); when all are busy an operation waits for
one up to ``CHANNEL_LAYER_POOL_WAIT_S`` and its socket then closes with 1013 (``webapp.sockets``)."""
CHANNEL_LAYER_POOL_WAIT_S = float(os.environ.get("STUDIO_CHANNEL_LAYER_POOL_WAIT_S", "10"))
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "webapp.sockets.PooledRedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": CHANNEL_LAYER_READ_TIMEOUT_S,
                    "max_connections": CHANNEL_LAYER_CONNECTIONS,
                    "timeout": CHANNEL_LAYER_POOL_WAIT_S,
                }
            ],
            "prefix": os.environ.get("STUDIO_CHANNEL_PREFIX", "studio"),
        },
    }
}
STUDIO_SOCKETS_PER_USER = int(os.environ.get("STUDIO_SOCKETS_PER_USER", "20"))
"""Live run sockets one user may hold open at once, on all web servers together; beyond, a socket closes
with 4429 and the page asks the user to close some tabs (``webapp.consumers``)."""
SOCKET_SLOT_TTL_S = float(os.environ.get("STUDIO_SOCKET_SLOT_TTL_S", "60"))
"""An open socket renews its slot every third of this; a slot of a web server that died lapses after it."""
STUDIO_METRICS_TOKEN = os.environ.get("STUDIO_METRICS_TOKEN", "")
"""A scraper sending ``Authorization: Bearer <this>`` may read ``/metrics`` (staff users may anyway);
empty: no token is accepted."""

SOCKET_ACCESS_RECHECK_S = float(os.environ.get("STUDIO_SOCKET_ACCESS_RECHECK_S", "5"))
"""A live socket checks its viewer's access (still logged in, run still visible) at least this often, and at
once when a run's sharing or a user's rights change through the product or a logout ends its session
(``webapp.apps``). Checking before every event cost two database reads per viewer per event: with 50
viewers the web server spent its time on them (``benchmarks/bench_live_page.py``)."""

# The default cache stays per process; the API's rate limit counts in Redis, shared by every web process.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "api": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "studio-api",
    },
}
STUDIO_API_RATE = os.environ.get("STUDIO_API_RATE", "300/min")
"""Requests per user (all their tokens and their session together) the REST API answers; beyond: 429."""
NINJA_PAGINATION_PER_PAGE = 100
NINJA_PAGINATION_MAX_LIMIT = 1000

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = "django-db"  # results are durable rows in PostgreSQL
CELERY_RESULT_EXTENDED = True
CELERY_TASK_DEFAULT_QUEUE = "default"  # light work: bank imports, exports, previews
CELERY_TASK_ROUTES = {"webapp.tasks.train_run": {"queue": "training"}}  # runs only: each holds a slot long
CELERY_TASK_TRACK_STARTED = True
CELERY_TASK_ACKS_LATE = True  # a task whose worker dies goes back to the queue
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # one task reserved per slot: a queued run waits for any free worker
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
STUDIO_WORKER_CONCURRENCY = int(os.environ.get("STUDIO_WORKER_CONCURRENCY", "2"))
"""Runs the training worker of ``manage.py up`` trains at once (queue ``training``), each in a process."""
STUDIO_TRAINING_NICE = int(os.environ.get("STUDIO_TRAINING_NICE", "10"))
"""How much lower than its worker's the CPU priority of a training process is (``nice``; 0: the same)."""
STUDIO_LIGHT_WORKER_CONCURRENCY = int(os.environ.get("STUDIO_LIGHT_WORKER_CONCURRENCY", "2"))
"""Light tasks (queue ``default``) the second worker of ``manage.py up`` runs at once, beside the runs."""
STUDIO_LIGHT_WORK_NICE = int(os.environ.get("STUDIO_LIGHT_WORK_NICE", "5"))
"""How much lower than the web server's the CPU priority of the light worker of ``manage.py up`` is (``nice``;
0: the same): its exports and previews must not hold pages back, nor a run hold them back (between the web
server's and training's, ``STUDIO_TRAINING_NICE``). A queued import's work runs lower still
(``STUDIO_IMPORT_NICE``)."""
STUDIO_IMPORT_NICE = int(os.environ.get("STUDIO_IMPORT_NICE", "19"))
"""The CPU priority (``nice``, absolute) of a queued bank import's embedding in the light worker (a thread of
its own), below a training process's (its worker's + ``STUDIO_TRAINING_NICE``); on an idle machine it has
every core (measured by ``benchmarks/bench_import_beside_training.py``)."""
STUDIO_IMPORT_IDLE = os.environ.get("STUDIO_IMPORT_IDLE", "0") not in ("0", "false", "no", "")
"""Whether a queued import's embedding runs under Linux's ``SCHED_IDLE`` policy instead: a core only when
nothing else wants it. Beside a CPU-bound training run it then waits until the run leaves a core (its steps
took 1.06× as long, the import embedded nothing); off, ``STUDIO_IMPORT_SHARE`` bounds what the run pays."""
STUDIO_IMPORT_SHARE = float(os.environ.get("STUDIO_IMPORT_SHARE", "0.5"))
"""Beside work that keeps the cores busy (a training run), the most of the wall time a queued import embeds
(it pauses for the rest; on an idle machine it never pauses), in (0, 1]. At 0.5 a CPU-bound run's steps took
1.10× as long while the import went on at 3.5 lines/s; at 1 (nice alone) 1.30× at 8 lines/s. Not used with
``STUDIO_IMPORT_IDLE``, where the import only ever takes what nothing else wants."""
if not 0 < STUDIO_IMPORT_SHARE <= 1:
    raise ValueError(f"STUDIO_IMPORT_SHARE must be a share of wall time in (0, 1], got {STUDIO_IMPORT_SHARE}")
STUDIO_IMPORT_HEARTBEAT_S = float(os.environ.get("STUDIO_IMPORT_HEARTBEAT_S", "30"))
"""While an import's batch waits for a core, how often it says it is alive and looks for a cancel."""
STUDIO_WEB_PROCESSES = int(os.environ.get("STUDIO_WEB_PROCESSES", "2"))
"""Web-server processes ``manage.py up`` starts (uvicorn ``--workers``; they share the port). One process runs
Python on one core at a time: on a 2-core machine one saturated at ~24 requests/s under the load benchmark.
Each holds its own database pool (``STUDIO_DB_POOL_WEB``) and channel-layer connections; sockets and groups
work across them through Redis."""

EXPERIMENT_RESULTS_DIR = Path(os.environ.get("STUDIO_EXPERIMENT_RESULTS", BASE_DIR / "docs" / "experiments"))
"""Where finished experiment cells copy their small result files, and reports are written."""

STUDIO_WARM_START = env_bool("STUDIO_WARM_START", True)
"""The web server and each worker process load the embedding model in the background as they start."""

# ---- models a launch may name ---------------------------------------------------------------
STUDIO_MODEL_DIRS = [p for p in os.environ.get("STUDIO_MODEL_DIRS", "").split(os.pathsep) if p]
"""Folders (besides the prepared models in var/models) whose model checkpoints launches may use."""
STUDIO_ALLOW_HUB_MODELS = env_bool("STUDIO_ALLOW_HUB_MODELS", False)
"""Allow Hugging Face hub ids (org/name) in launches: only where workers can download or have them cached."""

# ---- auth --------------------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # login throttling (django-axes) before the real check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("STUDIO_LOGIN_FAILURES", "10"))
"""Failed logins for one username from one address before it is locked out for AXES_COOLOFF_TIME."""
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_IPWARE_PROXY_COUNT = int(os.environ.get("STUDIO_PROXY_COUNT", "0"))
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the cookie-less meta tag; keep default
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (django-csp): scripts only from this origin, no inline scripts anywhere
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],  # htmx and uPlot set element styles
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],  # the run page's WebSocket is same-origin
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
        "base-uri": ["'self'"],
        "object-src": ["'none'"],
    }
}
if env_bool("HTTPS", False):
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = int(os.environ.get("STUDIO_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("STUDIO_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # submitting a domain to the browsers' preload list is the domain owner's lasting decision, not a
        # default: STUDIO_HSTS_PRELOAD=true sends the preload directive
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

# ---- static files, i18n, logging -----------------------------------------------------------
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {name: {"level": "WARNING"} for name in ("pgserver", "daphne", "django.channels.server")},
}
