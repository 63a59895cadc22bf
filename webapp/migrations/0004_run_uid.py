import uuid

from django.db import migrations, models


def fill_uids(apps, schema_editor):
    Run = apps.get_model("webapp", "Run")
    for run in Run.objects.filter(uid__isnull=True).only("pk"):
        Run.objects.filter(pk=run.pk).update(uid=uuid.uuid4())


class Migration(migrations.Migration):
    """Add a unique, stable folder name per run (Django's recipe for a unique field on existing rows)."""

    dependencies = [("webapp", "0003_run_progress")]

    operations = [
        migrations.AddField(model_name="run", name="uid", field=models.UUIDField(null=True, editable=False)),
        migrations.RunPython(fill_uids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="run",
            name="uid",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, help_text="Names its folder.", unique=True
            ),
        ),
    ]
