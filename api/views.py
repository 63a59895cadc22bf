"""The account page: who you are, what you may do, and your personal access tokens for the API."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from api.forms import TokenForm
from api.tokens import token_create, token_list, token_revoke
from webapp.services import can_launch


def account(request: HttpRequest) -> HttpResponse:
    return _account_page(request, TokenForm())


@require_POST
def token_new(request: HttpRequest) -> HttpResponse:
    """Create a token and show its secret in this response only: it is stored as a hash, never shown again."""
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _account_page(request, form, status=400)
    data = form.cleaned_data
    token, secret = token_create(request.user, data["name"], data["scope"], data["expires_in_days"])
    return _account_page(request, TokenForm(), new_token=token, secret=secret)


@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    token = token_revoke(request.user, token_id)
    messages.success(request, f"Revoked the token {token.name!r}: it no longer works.")
    return redirect("account")


def _account_page(request: HttpRequest, form: TokenForm, *, status: int = 200, **extra) -> HttpResponse:
    context = {
        "form": form,
        "tokens": token_list(request.user),
        "can_launch": can_launch(request.user),
        **extra,
    }
    response = render(request, "api/account.html", context, status=status)
    if "secret" in extra:
        response["Cache-Control"] = "no-store"
    return response
