"""The Django project (settings, ASGI, Celery, URLs) and the dashboard app."""

from webapp.celery import app as celery_app

__all__ = ("celery_app",)
