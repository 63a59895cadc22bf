"""The experience bank: entries, their change history, merge records and Search-and-Ask exchanges."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.db import models
from django.utils import timezone
from pgvector.django import HnswIndex, VectorField

EMBEDDING_DIM = 384  # all-MiniLM-L6-v2
FTS_CONFIG = "english"


def search_document() -> SearchVector:
    """The full-text document of an entry; the GIN index is built on exactly this expression."""
    return SearchVector("title", "content", config=FTS_CONFIG)


class GenerationFields(models.Model):
    """The extractor sample (prompt, response, token ids, old log-probs, weight version) behind a text."""

    generation_prompt = models.TextField(blank=True)
    generation_response = models.TextField(blank=True)
    generation_token_ids = models.JSONField(default=list, blank=True)
    generation_logprobs = models.JSONField(default=list, blank=True)
    generation_weight_version = models.IntegerField(null=True, blank=True)

    class Meta:
        abstract = True


class ExperienceQuerySet(models.QuerySet):
    def live(self) -> ExperienceQuerySet:
        return self.filter(deleted_at__isnull=True)

    def in_bank(self, run_id: int | None, scope: str | None = None) -> ExperienceQuerySet:
        qs = self.live().filter(run_id=run_id)
        return qs if scope is None else qs.filter(scope=scope)


class Experience(GenerationFields):
    """One entry of a run's experience bank: a short title and abstract, reusable content."""

    run = models.ForeignKey("webapp.Run", on_delete=models.CASCADE, related_name="experiences", null=True)
    scope = models.CharField(max_length=100, default="shared", help_text="Task scope, or 'shared'.")
    title = models.CharField(max_length=300)
    content = models.TextField()
    embedding = VectorField(dimensions=EMBEDDING_DIM)
    embedding_model = models.CharField(max_length=200, blank=True)
    version = models.PositiveIntegerField(default=1, help_text="Incremented on every change of the entry.")
    # provenance
    source_episode = models.CharField(max_length=200, blank=True)
    created_step = models.IntegerField(default=0)
    updated_step = models.IntegerField(default=0)
    # usage and training counters (updated with F() expressions, never read-modify-write)
    retrieval_count = models.PositiveIntegerField(default=0)
    last_retrieved_at = models.DateTimeField(null=True, blank=True)
    training_count = models.PositiveIntegerField(default=0)
    last_trained_step = models.IntegerField(null=True, blank=True)
    guided_successes = models.PositiveIntegerField(default=0)
    guided_failures = models.PositiveIntegerField(default=0)
    # curation
    pinned = models.BooleanField(default=False, help_text="Pinned entries are never merged away or evicted.")
    deleted_at = models.DateTimeField(null=True, blank=True, help_text="Soft deletion: kept for undo.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ExperienceQuerySet.as_manager()

    class Meta:
        indexes = [
            # Queries order by cosine distance (embeddings are normalised), so index that operator class.
            HnswIndex(
                name="experience_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=128,
                opclasses=["vector_cosine_ops"],
            ),
            models.Index(fields=["run", "scope", "deleted_at"], name="experience_bank_idx"),
            GinIndex(search_document(), name="experience_fts"),
        ]
        permissions = [("edit_bank", "Can edit, pin, delete, prune and import experience banks")]

    def __str__(self) -> str:
        return self.title

    @property
    def is_deleted(self) -> bool:
        return self.deleted_at is not None

    @property
    def guided_total(self) -> int:
        return self.guided_successes + self.guided_failures

    @property
    def success_rate(self) -> float | None:
        return self.guided_successes / self.guided_total if self.guided_total else None


class Merge(models.Model):
    """One chunk of a periodic merge: what the merge function saw, what it answered, what was applied."""

    class Decision(models.TextChoices):
        KEEP = "keep", "kept everything"
        CHANGED = "changed", "merged, rewrote or discarded entries"
        UNPARSEABLE = "unparseable", "unparseable output: originals kept"
        STALE = "stale", "entries changed meanwhile: originals kept"

    run = models.ForeignKey("webapp.Run", on_delete=models.CASCADE, related_name="merges", null=True)
    scope = models.CharField(max_length=100)
    step = models.IntegerField(default=0)
    chunk = models.PositiveIntegerField(
        default=0, help_text="Position of the chunk in its pass over the bank."
    )
    inputs = models.JSONField(default=list, help_text="Snapshots of the chunk's entries, carried ones first.")
    actions = models.JSONField(default=list, help_text="The parsed plan as applied (after pin protection).")
    outputs = models.JSONField(default=list, help_text="Ids of the entries created or rewritten.")
    carried = models.JSONField(default=list, help_text="Ids carried into the next chunk.")
    decision = models.CharField(max_length=16, choices=Decision.choices)
    raw_output = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    undone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"merge #{self.pk} ({self.scope}, step {self.step}): {self.decision}"


class AppliedBatch(models.Model):
    """A batch of extractor operations applied under a key, in the same transaction as its operations: a
    process killed after the commit but before it journaled the batch does it again on resume, and the
    key makes that second apply a no-op instead of a second copy of every entry."""

    run = models.ForeignKey("webapp.Run", on_delete=models.CASCADE, related_name="applied_batches", null=True)
    key = models.CharField(max_length=200)
    results = models.JSONField(default=list, help_text="Each operation's entry id and refusal, in order.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], nulls_distinct=False, name="applied_batch_once")
        ]

    def __str__(self) -> str:
        return f"batch {self.key} of run {self.run_id}"


class ExperienceChange(models.Model):
    """One change of one entry, with snapshots before and after, so it can be inspected and undone."""

    class Kind(models.TextChoices):
        ADD = "add"
        UPDATE = "update"
        DELETE = "delete"
        PIN = "pin"
        UNPIN = "unpin"
        MERGE_ADD = "merge_add", "created by a merge"
        MERGE_REWRITE = "merge_rewrite", "rewritten by a merge"
        MERGE_REMOVE = "merge_remove", "removed by a merge"
        EVICT = "evict", "evicted (capacity)"
        IMPORT = "import"
        UNDO = "undo"

    class Actor(models.TextChoices):
        EXTRACTOR = "extractor"
        MERGE = "merge"
        PERSON = "person"
        IMPORT = "import"
        SYSTEM = "system"

    experience = models.ForeignKey(Experience, on_delete=models.CASCADE, related_name="changes")
    run = models.ForeignKey(
        "webapp.Run", on_delete=models.CASCADE, related_name="experience_changes", null=True
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    actor = models.CharField(max_length=16, choices=Actor.choices)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    merge = models.ForeignKey(Merge, on_delete=models.CASCADE, null=True, blank=True, related_name="changes")
    batch = models.CharField(
        max_length=32, blank=True, db_index=True, help_text="Groups the changes of one bulk action (a prune)."
    )
    step = models.IntegerField(default=0)
    before = models.JSONField(null=True, blank=True, help_text="Snapshot before the change (None: created).")
    after = models.JSONField(default=dict)
    undone_by = models.OneToOneField(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="undoes"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["experience", "-id"], name="experience_change_entry_idx")]

    def __str__(self) -> str:
        return f"{self.kind} of #{self.experience_id} by {self.actor}"


class SearchAsk(GenerationFields):
    """One Search-and-Ask exchange: the actor's query, the entry found, the extractor's refined text."""

    run = models.ForeignKey("webapp.Run", on_delete=models.CASCADE, related_name="search_asks", null=True)
    scope = models.CharField(max_length=100)
    query = models.TextField()
    experience = models.ForeignKey(Experience, on_delete=models.SET_NULL, null=True, blank=True)
    similarity = models.FloatField(null=True, blank=True)
    refined = models.TextField()
    episode_id = models.CharField(max_length=200, blank=True, db_index=True)
    step = models.IntegerField(default=0)
    success = models.BooleanField(null=True, blank=True, help_text="Outcome of the episode, once known.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"search-and-ask #{self.pk}: {self.query[:40]}"


class ImportJobQuerySet(models.QuerySet):
    def active(self) -> ImportJobQuerySet:
        return self.exclude(status__in=ImportJob.ENDED)


class ImportJob(models.Model):
    """One JSONL import into a bank: validated, then embedded into staging rows (``ImportRow``), then
    added to the bank in one transaction at the end (all or nothing). Large uploads run as a task."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        VALIDATING = "validating"
        EMBEDDING = "embedding"
        WRITING = "writing"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ENDED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    run = models.ForeignKey("webapp.Run", on_delete=models.CASCADE, related_name="import_jobs", null=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    file_name = models.CharField(max_length=255, blank=True)
    path = models.CharField(max_length=500, blank=True, help_text="The uploaded file while a task holds it.")
    size = models.BigIntegerField(default=0, help_text="Bytes.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    lines = models.PositiveIntegerField(default=0, help_text="Non-empty lines (known after validation).")
    done = models.PositiveIntegerField(default=0, help_text="Lines validated, then lines embedded.")
    entries = models.PositiveIntegerField(default=0, help_text="Entries added to the bank.")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    phase_started_at = models.DateTimeField(
        null=True, blank=True, help_text="When its current phase (validating, embedding, writing) began."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Asked to stop: it stops before it writes, importing nothing.",
    )
    giving_way_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Since when it has been sharing the CPU with other work that keeps the cores busy (a "
        "training run): it embeds more slowly, or waits; empty while it runs at full speed.",
    )

    objects = ImportJobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"import #{self.pk} of {self.file_name or 'a file'}: {self.status}"

    @property
    def finished(self) -> bool:
        return self.status in self.ENDED

    def mark_failed(self, message: str) -> None:
        """Nothing was imported; ``message`` says why (shown on the bank page). A NUL byte quoted from the
        file (PostgreSQL text cannot hold one) is shown as \\x00."""
        ImportJob.objects.filter(pk=self.pk).update(
            status=self.Status.FAILED,
            error=message.replace("\x00", "\\x00")[:10_000],
            finished_at=timezone.now(),
        )

    @property
    def percent(self) -> int:
        """Progress of the current phase."""
        return min(100, 100 * self.done // self.lines) if self.lines else 0


class ImportRow(models.Model):
    """One validated, embedded line of an import, waiting for the final transaction."""

    job = models.ForeignKey(ImportJob, on_delete=models.CASCADE, related_name="rows")
    number = models.PositiveIntegerField(help_text="Line number in the file.")
    fields = models.JSONField(help_text="The entry's model fields (no id, run or owner).")
    embedding = VectorField(dimensions=EMBEDDING_DIM)

    class Meta:
        indexes = [models.Index(fields=["job", "number"], name="import_row_job_idx")]

    def __str__(self) -> str:
        return f"line {self.number} of import #{self.job_id}"
