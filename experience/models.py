from __future__ import annotations

from django.db import models
from pgvector.django import HnswIndex, VectorField

EMBEDDING_DIM = 384  # all-MiniLM-L6-v2


class Experience(models.Model):
    """One entry of a run's experience bank: a short title and abstract, reusable content."""

    run = models.ForeignKey("webapp.Run", on_delete=models.CASCADE, related_name="experiences", null=True)
    scope = models.CharField(max_length=100, default="shared", help_text="Task scope, or 'shared'.")
    title = models.CharField(max_length=300)
    content = models.TextField()
    embedding = VectorField(dimensions=EMBEDDING_DIM)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # Queries order by cosine distance (embeddings are normalised), so index that operator class.
            HnswIndex(
                name="experience_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            )
        ]

    def __str__(self) -> str:
        return self.title
