from django.contrib.auth.decorators import login_not_required
from django.urls import path

from api import views
from api.endpoints import api


def _api_urls():
    """The API's URLs, exempt from the site's login redirect: each answers 401 itself to a caller without a
    session or token (the operations through their ``auth``, the schema and docs through ``signed_in``)."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        login_not_required(pattern.callback)
    return patterns, app_name, namespace


urlpatterns = [
    path("account/", views.account, name="account"),
    path("account/tokens/", views.token_new, name="token_new"),
    path("account/tokens/<int:token_id>/revoke/", views.token_revoke_view, name="token_revoke"),
    path("api/v1/", _api_urls()),
]
