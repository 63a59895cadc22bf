"""manage.py plan: the launch plan as a table; a launch that does not fit exits non-zero with why."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command


def test_manage_py_plan_prints_the_cpu_presets_plan() -> None:
    out = io.StringIO()
    call_command("plan", "--preset", "cpu", "--set", "method=grpo", "--devices", "cpu:24GB", stdout=out)
    assert "actor: grads + AdamW" in out.getvalue()
    assert out.getvalue().rstrip().endswith("fits")


def test_manage_py_plan_refuses_the_paper_preset_on_this_box_with_numbers() -> None:
    with pytest.raises(
        CommandError,
        match=r"refused: it needs 8 devices, the worker has 1 \([\d,.]+ GB per device on 8; 1 × 24 GB",
    ):
        call_command("plan", "--config", "paper", "--devices", "cpu:24GB", stdout=io.StringIO())
