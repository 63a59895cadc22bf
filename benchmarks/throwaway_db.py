"""A database of a benchmark's own on the embedded services: made from the migrations, dropped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def throwaway_database(name: str) -> Iterator[None]:
    """Start the embedded services, set Django up on a fresh database ``name`` and drop it on the way out."""
    import django
    from django.conf import settings

    from webapp import embedded

    embedded.start_all()
    settings.DATABASES["default"]["TEST"] = {"NAME": name}
    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield
    finally:
        connection.close_pool()  # its idle connections would keep the database from being dropped
        connection.creation.destroy_test_db(old_name, verbosity=0)
