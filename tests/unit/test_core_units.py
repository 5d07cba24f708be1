"""kimi_hotfix.runtime.outcome.decide in-process: what a patch's check gives, turned into
the decision the core acts on (arming and settling: test_states.py, in
children)."""

from __future__ import annotations

import sys

import pytest

sys.path.append(str(__import__("helpers").STANDINS))
from fakes import Fake  # noqa: E402

from kimi_hotfix.runtime import base, outcome, patching  # noqa: E402


def test_a_check_that_returns_no_decision_cannot_tell_and_says_what_it_returned():
    decision = outcome.decide(Fake("odd", decision="yes"), None, 0)
    assert decision == patching.cannot_tell("its decide returned 'yes'")
    assert outcome.decide(Fake("none"), None, 0) == patching.cannot_tell("its decide returned None")


def test_a_check_that_raises_cannot_tell_unless_its_target_is_missing():
    assert outcome.decide(Fake("raises", raises=ValueError("boom")), None, 0) \
        == patching.cannot_tell("its decide raised ValueError: boom")
    with pytest.raises(base.PatchError, match="Thing.first not found"):
        outcome.decide(Fake("missing", raises=base.PatchError("Thing.first not found")), None, 0)
    decision = patching.needed("the bug is there")
    assert outcome.decide(Fake("needed", decision), None, 0) is decision


def test_the_check_gets_the_optimize_level_asked_or_this_interpreters():
    seen = []

    class Probe(Fake):
        def decide(self, module, optimize):
            seen.append((module, optimize))
            return patching.fixed("ok")

    outcome.decide(Probe("p"), "mod", 2)
    outcome.decide(Probe("p"), "mod")
    assert seen == [("mod", 2), ("mod", sys.flags.optimize)]
