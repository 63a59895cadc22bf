"""How the report's sections write: numbers, Markdown tables and the plots' shared look."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def fmt(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals; a dash for a missing or NaN value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def escape(text: str) -> str:
    """``text`` on one line inside a table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def step_axis(ax: Any) -> None:
    """An x-axis of actor steps: labelled, whole numbers only, a light grid."""
    ax.set_xlabel("actor step")
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)


def pyplot() -> Any:
    """matplotlib's pyplot on the headless backend."""
    # imported here: matplotlib is heavy and only a report with plots needs it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
