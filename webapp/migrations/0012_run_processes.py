from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("webapp", "0011_episode_kind"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="processes",
            field=models.JSONField(
                blank=True,
                db_default={},
                default=dict,
                help_text="Its training processes, recorded by their supervisor: host and [pid, start time] "
                "of each (the child, or torchrun and every rank). A claim waits while one of them lives.",
            ),
        ),
    ]
