"""Pages of a list: ``limit`` and ``offset`` bounded before they reach the database."""

from __future__ import annotations

from django.conf import settings
from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination, paginate

from api.schemas import BIGINT_MAX


class BoundedLimitOffset(LimitOffsetPagination):
    """Ninja's limit/offset pages, with an offset PostgreSQL can take: a larger one is refused (422) here,
    not failed on in the database (500)."""

    class Input(Schema):
        limit: int = Field(settings.NINJA_PAGINATION_PER_PAGE, ge=1, le=settings.NINJA_PAGINATION_MAX_LIMIT)
        offset: int = Field(0, ge=0, le=BIGINT_MAX)


paginated = paginate(BoundedLimitOffset)
"""``@paginated`` under an operation that answers a queryset: it answers ``{"items": [...], "count": n}``."""
