"""A number field takes the digits 0-9 (issue 49): Python reads any script's digits ("１２" is 12), so a form
took a full-width digit as a number the page never showed."""

from __future__ import annotations

import pytest
from django.http import QueryDict

from tests.webapp.test_launch_properties import _valid
from webapp.forms import BadParameter, LaunchForm, int_param

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("field", "value"), [("steps", "３"), ("seed", "٥"), ("actor_lr", "１e-5")])
def test_the_launch_form_refuses_a_number_in_other_digits_naming_the_field(field, value):
    form = LaunchForm(_valid() | {field: value})
    assert not form.is_valid()
    assert form.errors[field] == ["write the number with the digits 0-9"]


def test_the_same_numbers_in_ascii_digits_are_taken():
    form = LaunchForm(_valid() | {"steps": " 3 ", "seed": "5", "actor_lr": "1e-5"})
    assert form.is_valid(), form.errors


def test_a_query_parameter_in_other_digits_is_a_bad_parameter():
    with pytest.raises(BadParameter, match="step must be a whole number"):
        int_param(QueryDict("step=１"), "step")
    assert int_param(QueryDict("step=1"), "step") == 1
