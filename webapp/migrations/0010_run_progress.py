from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("webapp", "0009_experiment_name_per_owner"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="progress",
            field=models.JSONField(
                blank=True,
                db_default={},
                default=dict,
                help_text="Where the step is inside a long phase (trainer.report.Progress): phase, done of "
                "total, elapsed and estimated seconds left.",
            ),
        ),
    ]
