from django.contrib import admin

from api.models import AccessToken


@admin.register(AccessToken)
class AccessTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "scope", "hint", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = ("scope",)
    search_fields = ("name", "user__username", "hint")
    readonly_fields = ("digest", "hint", "created_at", "last_used_at")
