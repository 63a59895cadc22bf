"""JSON read strictly (RFC 8259), for every JSON the server takes from a person: request bodies, bank import
lines, socket frames. What Python's ``json`` would also take is refused with ``ValueError``: NaN and Infinity,
an object that repeats a key (Python keeps the last silently), nesting past the parser's recursion."""

from __future__ import annotations

import json
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        repeated = next(key for i, (key, _) in enumerate(pairs) if key in dict(pairs[:i]))
        raise ValueError(f"an object repeats the key {repeated!r}")
    return obj


def loads(text: str | bytes) -> Any:
    """``json.loads``, strictly; every refusal is a ``ValueError`` saying what was refused."""
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
