"""kimi_hotfix.runtime.config: the warnings' wording for one unknown name and for the
pod-files switch (the rest of the contract: test_config.py)."""

from __future__ import annotations

from kimi_hotfix.runtime import config

NAMES = ("kv_spec_merge", "capture_workspace")


def test_one_unknown_name_is_named_in_the_singular():
    (warning,) = config.parse(NAMES, environ={"KIMI_HOTFIX_FORCE": "nope"}).warning_texts
    assert warning == ("KIMI_HOTFIX_FORCE: unknown patch name 'nope' ignored; valid names: "
                       "kv_spec_merge, capture_workspace, or *")


def test_an_unknown_pod_files_value_writes_nothing_and_says_so():
    cfg = config.parse(NAMES, environ={"KIMI_HOTFIX_POD_FILES": "maybe"})
    assert cfg.pod_files is False
    assert cfg.warning_texts == (
        "KIMI_HOTFIX_POD_FILES='maybe' is not understood; valid values: 1/on/true/yes or "
        "0/off/false/no; using off (an unknown KIMI_HOTFIX_POD_FILES fails closed)",)
    assert config.parse(NAMES, environ={"KIMI_HOTFIX_POD_FILES": " OFF "}).pod_files is False
    assert config.parse(NAMES, environ={"KIMI_HOTFIX_POD_FILES": ""}).pod_files is True
