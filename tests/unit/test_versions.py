"""Version parsing and the status expectations (from the version string only).

The shim decides from vLLM's code, never from the version; these expectations
are what ``status`` shows without importing vLLM. That they match what the
probes find on each real release is tests/real/test_check.py's job.
"""

from __future__ import annotations

import pytest

from kimi_hotfix.runtime import core, versions


@pytest.mark.parametrize("text, parsed", [
    ("0.29.0", (0, 29, 0, False)),
    ("0.29", (0, 29, 0, False)),
    ("v0.33.0", (0, 33, 0, False)),
    ("0.29.1.dev3+gabc123", (0, 29, 1, True)),
    ("0.30.0rc1", (0, 30, 0, True)),
    ("0.30.0+cu128", (0, 30, 0, False)),
    ("garbage", None),
    ("", None),
    (None, None),
])
def test_parse_version(text, parsed):
    assert versions.parse(text) == parsed


@pytest.mark.parametrize("version, release, at_least", [
    ("0.30.0", "0.30.0", True),
    ("0.30.1", "0.30.0", True),
    ("0.29.9", "0.30.0", False),
    ("0.30.0.dev5+gabc", "0.30.0", False),  # a pre-release of 0.30.0 is older
    ("0.30.1.dev5+gabc", "0.30.0", True),
    ("1.0.0", "0.33.0", True),
    ("nonsense", "0.30.0", False),
])
def test_version_at_least(version, release, at_least):
    assert versions.at_least(version, release) is at_least


# (version, optimize) -> {patch: needed}, as the brief's table says (optimize does not
# matter to the patches: -O's asserts are -O parity's, below)
BEHAVIOUR = {
    "0.28.0": {"kv_spec_merge": False, "capture_workspace": False, "kda_overlong_rows": False},
    "0.29.0": {"kv_spec_merge": True, "capture_workspace": True, "kda_overlong_rows": True},
    "0.30.0": {"kv_spec_merge": False, "capture_workspace": False, "kda_overlong_rows": True},
    "0.33.0": {"kv_spec_merge": False, "capture_workspace": False, "kda_overlong_rows": False},
    "0.34.0": {"kv_spec_merge": False, "capture_workspace": False, "kda_overlong_rows": False},
}
EXPECT = {(version, optimize): needed for version, needed in BEHAVIOUR.items() for optimize in (0, 1, 2)}


@pytest.mark.parametrize("version, optimize", list(EXPECT))
def test_expectations(version, optimize):
    patches = core.patches()
    found = {name: patch.expect(version, optimize)[0] for name, patch in patches.items()}
    assert found == EXPECT[(version, optimize)]
    for patch in patches.values():
        needed, text = patch.expect(version, optimize)
        assert text and (needed is None or isinstance(needed, bool))


@pytest.mark.parametrize("version", list(BEHAVIOUR))
def test_parity_is_expected_under_o_only(version):
    from kimi_hotfix.tools import parity_probe
    assert [parity_probe.PROBE.expect(version, level)[0] for level in (0, 1, 2)] == [False, True, True]


def test_dev_builds_say_the_code_decides():
    for patch in core.patches().values():
        assert "dev build" in patch.expect("0.29.1.dev3+gabc", 0)[1]


def test_without_vllm_nothing_is_expected():
    for patch in core.patches().values():
        assert patch.expect(None, 1) == (None, "vLLM not installed: nothing to patch")
