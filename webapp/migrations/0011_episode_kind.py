from django.db import migrations, models


class Migration(migrations.Migration):
    """Evaluation episodes are recorded too: ``EpisodeRecord.kind`` (every earlier row is a training one)."""

    dependencies = [
        ("webapp", "0010_run_progress"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="episoderecord",
            name="webapp_epis_run_id_d9ebb6_idx",
        ),
        migrations.AddField(
            model_name="episoderecord",
            name="kind",
            field=models.CharField(
                choices=[("train", "training"), ("eval", "evaluation")], default="train", max_length=8
            ),
        ),
        migrations.AddIndex(
            model_name="episoderecord",
            index=models.Index(fields=["run", "kind", "step"], name="webapp_epis_run_id_b8ab5b_idx"),
        ),
    ]
