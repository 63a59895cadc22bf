"""The API's reference page (``docs/api.md``): a table of every operation generated from the served OpenAPI
schema, between markers, so the documentation cannot drift from the API. ``manage.py api_reference``
rewrites the block; a test fails when it differs from what the schema gives."""

from __future__ import annotations

import re
from pathlib import Path

from api.endpoints import api

BEGIN = "<!-- BEGIN generated: the API's OpenAPI schema (manage.py api_reference) -->\n"
END = "<!-- END generated -->"
BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
METHODS = ("get", "post", "put", "patch", "delete")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _body(request_body: dict | None) -> str:
    if request_body is None:
        return ""
    return "multipart file" if "multipart/form-data" in request_body.get("content", {}) else "JSON"


def operations_table(schema: dict) -> str:
    """One row per operation, grouped by tag in the schema's order: method, path, what it does, its
    parameters (``name`` or ``name*`` when required) and the body it takes (JSON, or a multipart file)."""
    rows = []
    for path, item in schema["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = ", ".join(
                f"`{p['name']}{'*' if p.get('required') else ''}`" for p in op.get("parameters", [])
            )
            body = _body(op.get("requestBody"))
            what = (op.get("description") or op.get("summary") or "").split("\n\n")[0]
            rows.append(((op.get("tags") or [""])[0], method.upper(), path, _cell(what), params, body))
    order = {tag: i for i, tag in enumerate(dict.fromkeys(r[0] for r in rows))}
    rows.sort(key=lambda r: order[r[0]])
    lines = [
        "| tag | method | path | what it does | parameters (* required) | body |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {tag} | {m} | `{p}` | {what} | {params} | {body} |" for tag, m, p, what, params, body in rows
    ]
    return "\n".join(lines) + "\n"


def block(schema: dict) -> str:
    return f"{BEGIN}{operations_table(schema)}{END}"


def current_schema() -> dict:
    return api.get_openapi_schema(path_prefix="/api/v1/")


def differs(page: Path, schema: dict) -> bool:
    match = BLOCK.search(page.read_text(encoding="utf-8"))
    return match is None or match.group(0) != block(schema)


def write(page: Path, schema: dict) -> None:
    text = page.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        raise ValueError(f"{page} has no '{BEGIN.strip()}' block")
    page.write_text(BLOCK.sub(lambda _: block(schema), text), encoding="utf-8")
