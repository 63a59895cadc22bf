import os
import secrets

from django.contrib.auth import get_user_model

from trainer.paths import var_dir
from webapp.management.database import DatabaseCommand


class Command(DatabaseCommand):
    help = (
        "Make sure an admin account exists. Username/password come from STUDIO_ADMIN_USER / "
        "STUDIO_ADMIN_PASSWORD, else 'admin' with a generated password printed once and kept in "
        "var/admin_password (readable only by you)."
    )

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = os.environ.get("STUDIO_ADMIN_USER", "admin")
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"admin account: {username} (exists)")
            return
        password = os.environ.get("STUDIO_ADMIN_PASSWORD")
        if not password:
            password = secrets.token_urlsafe(12)
            path = var_dir() / "admin_password"
            path.write_text(password + "\n")
            path.chmod(0o600)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(self.style.SUCCESS(f"admin account created: {username} / {password}"))
