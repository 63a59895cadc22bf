"""Reads of experience banks for the dashboard and commands: search, filters, prune previews, history."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db.models import Count, F, Q, QuerySet
from pgvector.django import CosineDistance

from experience import transfer
from experience.embedding import Embedder, default_embedder
from experience.models import FTS_CONFIG, Experience, ExperienceChange, ImportJob, Merge, search_document
from trainer.config import ConfigError, RunConfig
from trainer.envs.base import make_mixture
from trainer.store import SHARED_SCOPE

UNLISTED = (
    "embedding", "generation_prompt", "generation_response", "generation_token_ids", "generation_logprobs",
)  # fmt: skip
"""Fields a list of entries never shows, left in the database: the vector, and the extractor sample behind the
text (its prompt, response, token ids and log-probs, kilobytes per distilled entry; an entry's page reads
them)."""


def experience_list(
    run,
    *,
    scope: str | None = None,
    pinned: bool | None = None,
    min_retrievals: int | None = None,
    max_retrievals: int | None = None,
    include_deleted: bool = False,
) -> QuerySet[Experience]:
    """A run's entries, newest first, filtered by scope, pin and usage."""
    qs = Experience.objects.filter(run=run) if include_deleted else Experience.objects.in_bank(run.pk)
    if scope is not None:
        qs = qs.filter(scope=scope)
    if pinned is not None:
        qs = qs.filter(pinned=pinned)
    if min_retrievals is not None:
        qs = qs.filter(retrieval_count__gte=min_retrievals)
    if max_retrievals is not None:
        qs = qs.filter(retrieval_count__lte=max_retrievals)
    return qs.defer(*UNLISTED).order_by("-id")


def experience_scopes(run) -> list[str]:
    return list(
        Experience.objects.in_bank(run.pk).order_by("scope").values_list("scope", flat=True).distinct()
    )


def scopes_read_by(run) -> set[str] | None:
    """The scopes a run's episodes retrieve from (``trainer.coevolution.scopes_of``): each env of its mixture,
    or 'shared'; None when its method reads no experience or its config cannot be read."""
    try:
        cfg = RunConfig.from_dict(run.config)
    except ConfigError:
        return None
    if not cfg.uses_experience:
        return None
    return {SHARED_SCOPE} if cfg.experience.scope == SHARED_SCOPE else set(make_mixture(cfg.env).names)


def unread_scopes(run) -> dict[str, int]:
    """Entries of the bank in a scope no episode of the run retrieves from, counted by scope (an import
    meant for another environment): they take space and are never used."""
    read = scopes_read_by(run)
    if read is None:
        return {}
    rows = (
        Experience.objects.in_bank(run.pk)
        .exclude(scope__in=read)
        .values_list("scope")
        .annotate(n=Count("id"))
    )
    return dict(rows.order_by("scope"))


def experience_semantic_search(
    run,
    text: str,
    *,
    scope: str | None = None,
    limit: int = 20,
    min_similarity: float | None = None,
    embedder: Embedder | None = None,
) -> QuerySet[Experience]:
    """Entries closest in meaning to ``text`` (annotated with ``similarity``), at most ``limit``, only those
    with a cosine similarity of at least ``min_similarity`` when given; counts no retrieval."""
    vector = (embedder or default_embedder()).embed_one(text)
    qs = Experience.objects.in_bank(run.pk, scope).annotate(distance=CosineDistance("embedding", vector))
    if min_similarity is not None:
        qs = qs.filter(distance__lte=1 - min_similarity)
    return qs.annotate(similarity=1 - F("distance")).defer(*UNLISTED).order_by("distance")[:limit]


def experience_text_search(
    run, text: str, *, scope: str | None = None, limit: int = 20
) -> QuerySet[Experience]:
    """Full-text search over title and content (web-search syntax), best ``rank`` first."""
    query = SearchQuery(text, config=FTS_CONFIG, search_type="websearch")
    qs = Experience.objects.in_bank(run.pk, scope).annotate(document=search_document())
    qs = qs.filter(document=query).annotate(rank=SearchRank(search_document(), query))
    return qs.defer(*UNLISTED).order_by("-rank", "-id")[:limit]


@dataclass(frozen=True)
class PruneRule:
    """Which entries a bulk prune removes: those matching ALL the set criteria (``combine="all"``, the
    default) or ANY of them (``"any"``). Pinned ones never."""

    never_retrieved: bool = False
    """Entries no rollout ever retrieved."""
    success_rate_below: float | None = None
    """Entries whose guided success rate is below this..."""
    min_guided: int = 1
    """...over at least this many guided episodes."""
    older_than_step: int | None = None
    """Entries last changed before this training step."""
    scope: str | None = None
    """Limit the prune to one scope."""
    combine: str = "all"
    """'all': an entry must match every set criterion (each one narrows); 'any': one is enough."""

    def condition(self) -> Q:
        parts = []
        if self.never_retrieved:
            parts.append(Q(retrieval_count=0))
        if self.success_rate_below is not None:
            total = F("guided_successes") + F("guided_failures")
            parts.append(
                Q(guided_episodes__gte=self.min_guided, guided_successes__lt=self.success_rate_below * total)
            )
        if self.older_than_step is not None:
            parts.append(Q(updated_step__lt=self.older_than_step))
        if not parts:
            return Q(pk__in=[])  # matches nothing: an empty rule prunes nothing
        q = parts[0]
        for part in parts[1:]:
            q = (q & part) if self.combine == "all" else (q | part)
        return q


def experience_prune_preview(run, rule: PruneRule) -> QuerySet[Experience]:
    """What ``experience_prune(run, rule)`` would delete."""
    qs = Experience.objects.in_bank(run.pk, rule.scope).filter(pinned=False)
    qs = qs.annotate(guided_episodes=F("guided_successes") + F("guided_failures"))
    return qs.filter(rule.condition()).defer("embedding").order_by("id")


def experience_history(entry: Experience) -> QuerySet[ExperienceChange]:
    return entry.changes.select_related("user", "merge").order_by("-id")


def merge_list(run, *, scope: str | None = None) -> QuerySet[Merge]:
    qs = Merge.objects.filter(run=run)
    return qs if scope is None else qs.filter(scope=scope)


IMPORT_LIMITS = {
    "file_mb": transfer.FILE_MAX_BYTES // 2**20, "lines": f"{transfer.LINES_MAX:,}",
    "content": f"{transfer.CONTENT_MAX:,}", "title": transfer.TITLE_MAX, "scope": transfer.SCOPE_MAX,
    "line_mb": transfer.LINE_MAX_BYTES // 10**6,
}  # fmt: skip
"""What an import accepts, as the bank page states it."""


def import_jobs(run) -> QuerySet[ImportJob]:
    """A run's imports, newest first."""
    return ImportJob.objects.filter(run=run).select_related("user")
