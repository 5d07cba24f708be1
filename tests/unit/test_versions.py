"""Version parsing and the status expectations (from the version string only).

The shim decides from vLLM's code, never from the version; these expectations
are what ``status`` shows without importing vLLM. That they match what the
probes find on each real release is tests/real/test_check.py's job.
"""

from __future__ import annotations

import pytest

from kimi_hotfix.runtime import registry, versions
from kimi_hotfix.tools import about


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


# What status expects from a version string, derived from each patch's About (its
# releases), never from a hand-written table per patch; the real tier checks that the
# patches' own decisions on the real wheels agree (tests/real/test_check.py).
def _boundaries():
    """Every release a patch names, the one before it and the one after it."""
    found = {"0.28.0", "0.34.0"}
    for name in registry.names():
        info = about.of(name)
        for release in filter(None, (info.affects_from, info.fixed_in, info.removed_in)):
            major, minor, micro = versions.parse(release)[:3]
            found |= {release, f"{major}.{minor}.{micro + 1}",
                      f"{major}.{minor - 1}.0" if minor else release}
    return sorted(found, key=versions.parse)


def _oracle(info, version):
    """needed: from the first affected release, before the fix and before the code goes."""
    def before(release):
        return bool(release) and versions.parse(version) < versions.parse(release)
    return (not before(info.affects_from) and (not info.fixed_in or before(info.fixed_in))
            and (not info.removed_in or before(info.removed_in)))


@pytest.mark.parametrize("version", _boundaries())
@pytest.mark.parametrize("optimize", (0, 1, 2))
def test_expectations_follow_each_patchs_releases(version, optimize):
    for name in registry.names():
        info = about.of(name)
        needed, text = info.expect(version, optimize)
        assert needed is _oracle(info, version), (name, version, text)
        assert text.startswith("needed" if needed else "not "), text


def test_a_removed_code_path_is_not_affected_from_that_release():
    info = about.About(upstream="PR #1", summary="s", decides="d", symptoms=("x",),
                       affects_from="0.29.0", removed_in="0.31.0")
    assert [info.expect(v, 0)[0] for v in ("0.28.0", "0.29.0", "0.30.9", "0.31.0")] == [
        False, True, True, False]
    assert "gone from vLLM 0.31.0" in info.expect("0.32.0", 0)[1]


@pytest.mark.parametrize("fields, says", [
    (dict(summary=""), "summary is required"),
    (dict(symptoms=()), "symptoms is required"),
    (dict(symptoms=("",)), "symptoms is required"),
    (dict(fixed_in="0.30"), "not a release"),
    (dict(proposed="0001.patch"), "not a file under upstream/"),
    (dict(fixed_in="0.30.0", proposed="upstream/0001-x.patch"), "still proposed"),
])
def test_about_refuses_what_it_cannot_show(fields, says):
    base = dict(upstream="PR #1", summary="s", decides="d", symptoms=("x",))
    with pytest.raises(TypeError, match=says):
        about.About(**{**base, **fields})


@pytest.mark.parametrize("version", ["0.28.0", "0.29.0", "0.34.0"])
def test_parity_is_expected_under_o_only(version):
    assert [about.of("o_parity").expect(version, level)[0] for level in (0, 1, 2)] == [False, True, True]


def test_dev_builds_say_the_code_decides():
    for name in registry.names():
        assert "dev build" in about.of(name).expect("0.29.1.dev3+gabc", 0)[1]


def test_without_vllm_nothing_is_expected():
    for name in registry.names():
        assert about.of(name).expect(None, 1) == (None, "vLLM not installed: nothing to patch")
