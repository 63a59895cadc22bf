"""The one metrics type: what every phase of a step returns and the reporters receive."""

from __future__ import annotations

Metrics = dict[str, float]
"""Metric name (``"actor/loss"``, ``"time/rollout_s"``, …) → a plain float, never a tensor."""
