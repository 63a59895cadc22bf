"""Property-based: whatever dict, override or TOML text a user gives, the config parser returns a RunConfig or
raises ConfigError with a message, never another exception."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.config import ConfigError, RunConfig

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
DEFAULTS = RunConfig().to_dict()
SECTIONS = {k: v for k, v in DEFAULTS.items() if isinstance(v, dict)}
LEAVES = [k for k, v in DEFAULTS.items() if not isinstance(v, dict)]
DOTTED = LEAVES + [f"{s}.{k}" for s, keys in SECTIONS.items() for k in keys]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["nan", "inf", "-1", "1e309", "10**9", "true", "", "\x00", "../../etc/passwd", "0x10"]),
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
section = st.sampled_from(sorted(SECTIONS)).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.dictionaries(
            st.sampled_from(sorted(SECTIONS[name])) | st.text(max_size=8), json_values, max_size=4
        ),
    )
)
config_dicts = st.builds(
    lambda leaves, sections: leaves | dict(sections),
    st.dictionaries(st.sampled_from(LEAVES) | st.text(max_size=8), json_values, max_size=5),
    st.lists(section, max_size=3),
)


def _parses_or_refuses(build) -> None:
    try:
        cfg = build()
    except ConfigError as err:
        assert str(err)
    else:
        assert isinstance(cfg, RunConfig)
        assert all(math.isfinite(v) for v in (cfg.actor.lr, cfg.extractor.lr))


@SETTINGS
@given(config_dicts)
def test_any_dict_builds_a_config_or_is_refused_with_a_config_error(data):
    _parses_or_refuses(lambda: RunConfig.from_dict(data))


@SETTINGS
@given(st.dictionaries(st.sampled_from(DOTTED) | st.text(max_size=12), json_values, max_size=4))
def test_any_overrides_build_a_config_or_are_refused_with_a_config_error(overrides):
    _parses_or_refuses(lambda: RunConfig().with_overrides(**overrides))


@SETTINGS
@given(
    st.lists(
        st.one_of(
            st.builds(
                lambda k, v: f"{k} = {v}",
                st.sampled_from(DOTTED),
                st.sampled_from(
                    [
                        "1",
                        "-3",
                        "1e9",
                        "nan",
                        "inf",
                        '"x"',
                        "[1, 2]",
                        "{a = 1}",
                        "true",
                        '"cpu"',
                        "10000000000000",
                    ]
                ),
            ),
            st.sampled_from([f"[{s}]" for s in SECTIONS] + ['preset = "cpu"', 'preset = "nope"', "[[x]]"]),
            st.text(max_size=20),
        ),
        max_size=8,
    )
)
def test_any_toml_file_loads_or_is_refused_with_a_config_error(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("cfg") / "run.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    _parses_or_refuses(lambda: RunConfig.from_file(path))


@pytest.mark.parametrize("text", ["steps = ", "[actor\nlr = 1", "\x00"])
def test_a_file_that_is_not_toml_is_refused_with_a_config_error(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError):
        RunConfig.from_file(path)
