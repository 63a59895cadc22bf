"""The ASGI server the product runs (HTTP and WebSockets): uvicorn.

Not daphne: daphne reads a whole request body into memory before Django sees it, so a 50 MB bank import grew
the web server by 425-466 MiB, where uvicorn grew by 10 MiB (``benchmarks/bench_import_memory.py --server``).
"""

from __future__ import annotations

import sys


def command(host: str, port: int, *, processes: int = 1, python: str = sys.executable) -> list[str]:
    """The command line that serves the product on ``host:port`` from ``processes`` processes sharing the port
    (uvicorn's supervisor restarts one that dies), each calling ``webapp.asgi.served`` for its application.
    Django's ASGI app has no lifespan."""
    return [python, "-m", "uvicorn", "--factory", "webapp.asgi:served", "--host", host, "--port", str(port),
            "--workers", str(processes), "--lifespan", "off"]  # fmt: skip
