"""In a real browser, under the site's Content-Security-Policy: the launch form shows the plan before
anything is submitted and re-renders it as the person edits; a launch that fits no worker is refused with
the plan's numbers. Screenshots in test-artifacts/launch-plan-*.png."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from tests.e2e.conftest import ARTIFACTS
from tests.webapp.test_worker_devices import registry_of_its_own  # noqa: F401 - the server's registry too
from webapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_plan_follows_the_form_as_it_is_edited_and_a_launch_too_big_is_refused(
    server, browser_page, user
):
    user.user_permissions.add(Permission.objects.get(codename="launch_run"))
    page = browser_page
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(server + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    page.goto(server + "/runs/launch/")
    page.wait_for_selector("#plan-verdict")  # planned on load, before any edit
    assert "Fits:" in page.inner_text("#plan-verdict") and "peak per device" in page.inner_text("#plan-table")
    page.screenshot(path=str(ARTIFACTS / "launch-plan-01-fits.png"), full_page=True)

    page.fill("#id_tasks_per_step", "4096")
    page.fill("#id_k_rollouts", "4")
    page.wait_for_selector("#plan-refusal")  # re-planned as the fields changed
    refusal = page.inner_text("#plan-refusal")
    assert refusal.startswith("Refused: no worker can run this launch") and "live episodes (16384" in refusal
    page.screenshot(path=str(ARTIFACTS / "launch-plan-02-refused.png"), full_page=True)

    page.click("#launch-form button[type=submit]")
    page.wait_for_selector("#form-errors")
    assert "no worker can run this launch" in page.inner_text("#form-errors")
    assert not Run.objects.exists() and blocked == []
