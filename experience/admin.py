from django.contrib import admin

from experience.models import Experience, ExperienceChange, Merge, SearchAsk


class ReadOnlyAdmin(admin.ModelAdmin):
    """Inspection only: changes go through ``experience.services`` (embedded, recorded, undoable)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Experience)
class ExperienceAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "title",
        "run",
        "scope",
        "pinned",
        "retrieval_count",
        "guided_successes",
        "deleted_at",
    ]
    list_filter = ["scope", "pinned"]
    search_fields = ["title", "content"]
    exclude = ["embedding"]
    readonly_fields = [
        "version",
        "retrieval_count",
        "last_retrieved_at",
        "training_count",
        "last_trained_step",
    ]


@admin.register(ExperienceChange)
class ExperienceChangeAdmin(ReadOnlyAdmin):
    list_display = ["id", "experience", "kind", "actor", "user", "merge", "step", "created_at"]
    list_filter = ["kind", "actor"]


@admin.register(Merge)
class MergeAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "scope", "step", "chunk", "decision", "undone_at"]
    list_filter = ["decision"]


@admin.register(SearchAsk)
class SearchAskAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "scope", "query", "experience", "success", "step"]
