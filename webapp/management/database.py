"""Commands that use the database check it first, so a person reads what to do instead of a traceback."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor


def require_database(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Raise a CommandError that says what to run when the database is down or not migrated."""
    connection = connections[alias]
    try:
        connection.ensure_connection()
    except OperationalError as err:
        reason = str(err).strip().splitlines()[0]
        raise CommandError(
            f"cannot reach the database ({reason}): start the services with "
            "'python manage.py services start' ('make run' starts everything), "
            "or point DATABASE_URL at a running PostgreSQL"
        ) from None
    executor = MigrationExecutor(connection)
    missing = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if missing:
        raise CommandError(
            f"the database lacks {len(missing)} migration(s), first {missing[0][0]}: "
            "run 'python manage.py migrate' ('make run' does it)"
        )


class DatabaseCommand(BaseCommand):
    """A command whose every action reads or writes the database."""

    def execute(self, *args, **options):
        require_database()
        return super().execute(*args, **options)
