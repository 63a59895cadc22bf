"""The guide: the project's own documentation (``docs/*.md``, the pages MkDocs builds) read inside the
product, so a new user finds it one click from the home page without building the site."""

from __future__ import annotations

import re

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.safestring import mark_safe
from markdown_it import MarkdownIt

PAGE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")
"""A guide page: a top-level ``docs/<page>.md``."""
LINK = re.compile(r"^(?P<page>[a-z][a-z0-9_-]{0,40})\.md(?P<anchor>#[\w-]*)?$")


def guide_pages() -> list[str]:
    """The pages of the guide, in the order of the docs folder (index first)."""
    names = sorted(p.stem for p in (settings.BASE_DIR / "docs").glob("*.md") if PAGE.match(p.stem))
    return sorted(names, key=lambda n: n != "index")


def guide(request: HttpRequest, page: str = "index") -> HttpResponse:
    """One page of the guide, its links to other pages kept inside the guide."""
    path = settings.BASE_DIR / "docs" / f"{page}.md"
    if not PAGE.match(page) or not path.is_file():
        raise Http404(f"the guide has no page {page!r}")
    context = {"page": page, "pages": guide_pages(), "html": _page_html(path.read_text(encoding="utf-8"))}
    return render(request, "webapp/guide.html", context)


def _page_html(markdown: str):
    """Markdown as HTML with raw HTML escaped; ``other.md#part`` links point at the guide's page."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(markdown)
    for token in tokens:
        for child in token.children or []:
            href = str(child.attrGet("href") or "")
            if child.type == "link_open" and (m := LINK.match(href)):
                child.attrSet("href", reverse("guide_page", args=[m["page"]]) + (m["anchor"] or ""))
    return mark_safe(md.renderer.render(tokens, md.options, {}))  # noqa: S308 - markdown-it escaped it
