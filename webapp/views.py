from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp.selectors import run_list


def home(request: HttpRequest) -> HttpResponse:
    """The dashboard: the runs this user may see."""
    return render(request, "webapp/home.html", {"runs": run_list(request.user)})

