from django.contrib import admin

from webapp.models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "status", "method", "env", "step", "created_at")
    list_filter = ("status", "method", "env")
    search_fields = ("name",)
