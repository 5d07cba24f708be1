"""The environment contract (kimi_hotfix.runtime.config.parse), in process: no vLLM.

The same parser runs when vLLM is imported (tests/unit/test_faults.py checks the
logged warnings in child interpreters, one per variable)."""

from __future__ import annotations

import pytest

from kimi_hotfix.runtime import config

NAMES = ("kv_spec_merge", "capture_workspace", "kda_overlong_rows")


def parse(**env):
    return config.parse(NAMES, environ=env)


def test_defaults():
    cfg = parse()
    assert (cfg.enabled, cfg.disabled, cfg.forced, cfg.strict, cfg.log_level, cfg.warning_texts) == (
        True, frozenset(), frozenset(), False, "INFO", ())


@pytest.mark.parametrize("value", ["0", "off", "false", "no", " OFF ", "No"])
def test_master_switch_off(value):
    assert parse(KIMI_HOTFIX=value).enabled is False


@pytest.mark.parametrize("value", ["1", "on", "true", "yes", "", "  ", "TRUE"])
def test_master_switch_on(value):
    cfg = parse(KIMI_HOTFIX=value)
    assert cfg.enabled is True and cfg.warning_texts == ()


def test_lists_and_star():
    cfg = parse(KIMI_HOTFIX_DISABLE=" kv_spec_merge , ,capture_workspace",
                KIMI_HOTFIX_FORCE="kda_overlong_rows")
    assert cfg.disabled == {"kv_spec_merge", "capture_workspace"}
    assert cfg.forced == {"kda_overlong_rows"} and cfg.warning_texts == ()
    assert parse(KIMI_HOTFIX_DISABLE="*").disabled == set(NAMES)
    assert parse(KIMI_HOTFIX_FORCE="*").forced == set(NAMES)


def test_disable_wins_over_force():
    cfg = parse(KIMI_HOTFIX_DISABLE="kv_spec_merge", KIMI_HOTFIX_FORCE="*")
    assert cfg.forced == {"capture_workspace", "kda_overlong_rows"}
    assert cfg.warning_texts == ("kv_spec_merge both disabled and forced; KIMI_HOTFIX_DISABLE wins",)


def test_unknown_names_one_warning_per_variable():
    cfg = parse(KIMI_HOTFIX_DISABLE=",".join(f"bad{i}" for i in range(10)) + ",kv_spec_merge")
    assert cfg.disabled == {"kv_spec_merge"}
    (warning,) = cfg.warning_texts
    assert warning == ("KIMI_HOTFIX_DISABLE: unknown patch names 'bad0', 'bad1', 'bad2' and 7 "
                       "more ignored; valid names: kv_spec_merge, capture_workspace, "
                       "kda_overlong_rows, or *")


def test_bad_values_say_the_valid_ones_keep_the_default_and_the_switch_fails_closed():
    cfg = parse(KIMI_HOTFIX="maybe", KIMI_HOTFIX_STRICT="2", KIMI_HOTFIX_LOG_LEVEL="loud")
    assert (cfg.enabled, cfg.strict, cfg.log_level) == (False, False, "INFO")
    assert cfg.warning_texts == (
        "KIMI_HOTFIX='maybe' is not understood; valid values: 1/on/true/yes or 0/off/false/no; "
        "using off (an unknown KIMI_HOTFIX fails closed)",
        "KIMI_HOTFIX_STRICT='2' is not understood; valid values: 1/on/true/yes or "
        "0/off/false/no; using off",
        "KIMI_HOTFIX_LOG_LEVEL='loud' is not understood; valid values: DEBUG, INFO, WARNING, "
        "ERROR, CRITICAL; using INFO",
    )


def test_a_long_value_is_quoted_short():
    (warning,) = parse(KIMI_HOTFIX="x" * 100_000).warning_texts
    assert len(warning) < 250 and warning.startswith("KIMI_HOTFIX='xxxx")
    assert "... (100000 characters)" in warning


def test_raw_lists_only_what_was_set():
    cfg = parse(KIMI_HOTFIX_STRICT="1", OTHER="x")
    assert cfg.raw == (("KIMI_HOTFIX_STRICT", "1"),) and cfg.strict is True
