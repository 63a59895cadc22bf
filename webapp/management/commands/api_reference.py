from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from api import reference


class Command(BaseCommand):
    help = (
        "Rewrite the operations table of docs/api.md from the API's OpenAPI schema (--check: only compare)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--page", type=Path, default=Path(settings.BASE_DIR) / "docs" / "api.md")
        parser.add_argument("--check", action="store_true", help="fail if the page differs; write nothing")

    def handle(self, *args, page: Path, check: bool, **options):
        schema = reference.current_schema()
        if check:
            if reference.differs(page, schema):
                raise CommandError(f"{page} is out of date: run 'manage.py api_reference'")
            self.stdout.write(f"{page}: its operations table matches the schema")
            return
        try:
            reference.write(page, schema)
        except ValueError as err:
            raise CommandError(str(err)) from err
        self.stdout.write(f"{page}: operations table rewritten from the schema")
