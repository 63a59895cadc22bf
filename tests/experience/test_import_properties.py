"""Property-based: random and hostile JSON lines are checked by the import schema without an unhandled
exception, and an import with a rejected line changes nothing in the database."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experience import services, transfer
from experience.models import Experience, ExperienceChange, ImportRow

pytestmark = pytest.mark.django_db
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

VALID = {"format": transfer.FORMAT, "scope": "MiniHack", "title": "Walk to >", "content": "Take the stairs."}
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**25), max_value=10**25),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
    st.sampled_from(["\x00", "x" * 301, "2026-13-45", "1e999", "../../etc", "<script>", "𝔘𝔫𝔦"]),
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
FIELDS = [*VALID, "pinned", "provenance", "counters", "embedding", "embedding_model", "id", "run_id", "owner"]
hostile_records = st.builds(
    lambda changes: VALID | changes,
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, min_size=1, max_size=3),
)
hostile_lines = st.one_of(
    hostile_records.map(json.dumps),
    json_values.map(json.dumps),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["[1, 2]", "12", "null", '{"format": NaN}', "{" * 500, '"' + "a" * 100]),
)


@SETTINGS
@given(st.lists(hostile_lines, min_size=1, max_size=6))
def test_the_schema_accepts_or_names_the_bad_lines_and_never_raises_anything_else(lines):
    body = "".join(line.replace("\n", " ") + "\n" for line in lines)
    try:
        n = transfer.validate(io.StringIO(body))
    except transfer.ImportRejected as err:
        assert "line " in str(err) and "not valid experience entries" in str(err)
    else:
        assert n == sum(1 for line in lines if line.strip())


@SETTINGS
@given(st.lists(hostile_lines, max_size=4), st.integers(min_value=0, max_value=4))
def test_an_import_with_a_rejected_line_changes_nothing(run, user, lines, where):
    lines = [json.dumps(VALID), *lines]
    lines.insert(min(where, len(lines)), '{"format": "complementary-rl-experience/1", "pinned": "maybe"}')
    body = "".join(line.replace("\n", " ") + "\n" for line in lines).encode("utf-8", "surrogatepass")
    before = (Experience.objects.count(), ExperienceChange.objects.count())
    with pytest.raises(transfer.ImportRejected):
        services.experience_import(run, io.BytesIO(body), user=user)
    assert (Experience.objects.count(), ExperienceChange.objects.count()) == before
    assert not ImportRow.objects.exists()
