"""CSV files the web app writes. A cell of user text that starts like a formula is escaped (OWASP "CSV
injection"): a spreadsheet opening the file shows it as text instead of running it."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet may read as the start of a formula (OWASP's list)."""


def csv_cell(value: Any) -> Any:
    """``value`` as a safe CSV cell: text starting like a formula gets a leading ``'``; numbers are kept
    (a negative metric stays a number)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class CsvWriter:
    """``csv.writer`` whose every cell goes through ``csv_cell``: the one way the web app writes CSV."""

    def __init__(self, out: Any) -> None:
        self._writer = csv.writer(out)

    def writerow(self, row: Iterable[Any]) -> None:
        self._writer.writerow([csv_cell(value) for value in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)
