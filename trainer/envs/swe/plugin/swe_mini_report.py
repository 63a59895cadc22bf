"""pytest plugin loaded inside the SWE-mini sandbox: writes one JSON line per test outcome.

It runs in the sandboxed child with only this folder on the path beside the repository, so it
imports nothing from the project.
"""

import json
import os


def pytest_runtest_logreport(report):
    path = os.environ.get("SWE_MINI_REPORT")
    if not path:
        return
    failed = report.failed
    if not failed and not (report.when == "call" or report.skipped):
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", None) or []
    first = getattr(entries[0], "reprfileloc", None) if entries else None
    row = {
        "nodeid": report.nodeid,
        "outcome": "failed" if failed else ("skipped" if report.skipped else "passed"),
        "when": report.when,
        "message": crash.message if (failed and crash is not None) else "",
        "path": crash.path if (failed and crash is not None) else "",
        "lineno": crash.lineno if (failed and crash is not None) else 0,
        "test_lineno": first.lineno if (failed and first is not None) else 0,
    }
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_collectreport(report):
    path = os.environ.get("SWE_MINI_REPORT")
    if path and report.failed:
        with open(path, "a") as f:
            row = {
                "nodeid": report.nodeid,
                "outcome": "error",
                "when": "collect",
                "message": str(report.longrepr)[-500:],
            }
            f.write(json.dumps(row) + "\n")
