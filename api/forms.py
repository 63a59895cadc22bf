from __future__ import annotations

from django import forms

from api.models import AccessToken


class TokenForm(forms.Form):
    """A new personal access token: what it is for, what it may do, how long it lives."""

    name = forms.CharField(max_length=100, help_text="What it is for, e.g. 'sweep script on gpu-2'.")
    scope = forms.ChoiceField(choices=AccessToken.Scope.choices, initial=AccessToken.Scope.READ)
    expires_in_days = forms.TypedChoiceField(
        label="Expires",
        choices=[(30, "in 30 days"), (90, "in 90 days"), (365, "in a year"), ("", "never")],
        coerce=int,
        empty_value=None,
        required=False,
        initial=90,
    )
