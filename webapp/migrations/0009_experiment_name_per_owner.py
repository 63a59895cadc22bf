"""Experiment names are unique per owner (each user names experiments in a namespace of their own); the
folder an experiment's files live in keeps a name of its own, unique over all owners."""

from django.db import migrations, models


def folders_from_names(apps, schema_editor):
    Experiment = apps.get_model("webapp", "Experiment")
    Experiment.objects.update(folder=models.F("name"))  # names were unique: each keeps its folder


class Migration(migrations.Migration):
    dependencies = [
        ("webapp", "0008_run_restarts"),
    ]

    operations = [
        migrations.AddField(
            model_name="experiment",
            name="folder",
            field=models.CharField(max_length=120, null=True),  # no index yet: the next step makes one
        ),
        migrations.RunPython(folders_from_names, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="experiment",
            name="folder",
            field=models.SlugField(
                blank=True,
                help_text="Its folder under var/experiments/ and docs/experiments/: its name, or "
                "name--<owner id> when another owner's experiment had that name first.",
                max_length=120,
                unique=True,
            ),
        ),
        migrations.AlterField(
            model_name="experiment",
            name="name",
            field=models.SlugField(help_text="Unique among its owner's experiments.", max_length=80),
        ),
        migrations.AddConstraint(
            model_name="experiment",
            constraint=models.UniqueConstraint(fields=("owner", "name"), name="one_experiment_name_per_owner"),
        ),
    ]
