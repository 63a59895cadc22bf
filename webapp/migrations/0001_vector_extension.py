from django.db import migrations
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    """Enable pgvector before any model uses a vector column."""

    initial = True
    dependencies: list = []
    operations = [VectorExtension()]
