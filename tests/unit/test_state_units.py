"""kimi_hotfix.runtime.state (the store) and the core's policies on it, in-process,
on a snapshot of its tables (restored after each test): what ``records``,
``begin``/``end`` and ``mark_undone`` do to each kind of state, and what the
core's ``_fail_pending``, summary line and undo-during-apply make of them.
The same through arming, in child interpreters: test_states.py and
test_lifecycle.py."""

from __future__ import annotations

import sys

import pytest

from kimi_hotfix.runtime import core, registry, state
from kimi_hotfix.runtime.base import Kind, State
from kimi_hotfix.runtime.patching import Patch


@pytest.fixture
def tables(monkeypatch):
    for name in ("_states", "_records", "_settling"):
        monkeypatch.setattr(state, name, dict(getattr(state, name)))
    state._states.clear()
    state._records.clear()
    state._settling.clear()
    monkeypatch.setattr(state, "_names", registry.names())
    return state


def test_fail_pending_fails_the_pending_and_the_never_settled(tables):
    first, second, *rest = registry.names()
    tables._states[first] = State(Kind.APPLIED, "the bug is there")
    tables._states[second] = State(Kind.PENDING)
    tables._states[rest[0]] = State(Kind.DISABLED, "KIMI_HOTFIX_DISABLE")
    core._fail_pending("wrapt is not installed")  # rest[1:]: no state yet, so pending
    for name in [second, *rest[1:]]:
        assert tables.get(name) == State(Kind.FAILED, "wrapt is not installed")
    assert tables.get(first) == State(Kind.APPLIED, "the bug is there")
    assert tables.get(rest[0]).kind == Kind.DISABLED
    before = tables.states()
    core._fail_pending("again")  # nothing pending is left
    assert tables.states() == before


def test_records_of_a_patch_that_installed_nothing_is_empty(tables):
    assert tables.records("kimi_test_never") == []
    tables._records["kimi_test_some"] = ["r1", "r2"]
    got = tables.records("kimi_test_some")
    assert got == ["r1", "r2"] and got is not tables._records["kimi_test_some"]  # a copy
    assert tables.pop_records("kimi_test_some") == ["r1", "r2"]
    assert tables.records("kimi_test_some") == []


def test_begin_claims_only_a_pending_patch_once(tables):
    tables._states["kimi_a"] = State(Kind.PENDING)
    tables._states["kimi_b"] = State(Kind.APPLIED, "x")
    assert tables.begin("kimi_unknown") is None  # no state: not pending
    assert tables.begin("kimi_b") is None
    token = tables.begin("kimi_a")
    assert token is not None and tables.begin("kimi_a") is None  # claimed
    assert tables.end("kimi_a", token, State(Kind.APPLIED, "done")) is False
    assert tables.get("kimi_a") == State(Kind.APPLIED, "done") and "kimi_a" not in tables._settling


UNDONE = State(Kind.DISABLED, "undone", undone=True)


def test_mark_undone_by_kind(tables):
    tables._states.update(kimi_pending=State(Kind.PENDING), kimi_applied=State(Kind.APPLIED, "x"),
                          kimi_failed=State(Kind.FAILED, "y"))
    assert tables.mark_undone("kimi_pending", UNDONE) is None
    assert tables.get("kimi_pending") == UNDONE
    assert tables.mark_undone("kimi_never", UNDONE) is None  # no state yet: pending, so it stays off
    assert tables.get("kimi_never") == UNDONE
    assert tables.mark_undone("kimi_applied", UNDONE) == State(Kind.APPLIED, "x")
    assert tables.get("kimi_applied") == State(Kind.APPLIED, "x")  # the caller restores, then says
    assert tables.mark_undone("kimi_failed", UNDONE) == State(Kind.FAILED, "y")
    tables._states["kimi_settling"] = State(Kind.PENDING)
    token = tables.begin("kimi_settling")  # being applied in this thread
    assert tables.mark_undone("kimi_settling", UNDONE) is None and token.undone is True
    assert tables.end("kimi_settling", token, State(Kind.APPLIED, "done")) is True  # undo wins
    assert tables.get("kimi_settling") == UNDONE
    assert tables.records("kimi_settling") == []


def test_the_summary_and_its_json_fields_name_every_patch_pending_until_settled(tables, monkeypatch):
    from kimi_hotfix.runtime import versions
    monkeypatch.setattr(versions, "vllm_version", lambda: None)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    first, *rest = registry.names()
    tables._states[first] = State(Kind.APPLIED, "the bug is there")
    line = core.summary_line()
    assert "(vllm not installed, " in line
    assert f"{first}: applied" in line and all(f"{name}: pending" in line for name in rest)
    fields = core._fields()
    assert fields["vllm"] is None
    assert fields["states"] == {first: "applied (the bug is there)", **{name: "pending" for name in rest}}
    monkeypatch.setitem(sys.modules, "vllm", object())  # imported, no version found
    assert "(vllm version unknown, " in core.summary_line()


class Thing:
    def first(self):
        return "own"


class HalfwayUndone(Patch):
    """A patch whose apply is undone (another thread's undo()) before it returns,
    and whose wrapper something replaced since."""

    name, target = "kimi_halfway", "kimi_test_halfway_target"
    wraps = ("Thing.first",)

    def decide(self, module, optimize):
        from kimi_hotfix.runtime import patching
        return patching.needed("x")

    def apply(self, module, ctx):
        from kimi_hotfix.runtime import wrapping
        ctx.records.append(wrapping.Record(Thing, "first", vars(Thing)["first"], object()))
        core.undo("kimi_halfway")
        return None

    def probe(self):
        raise NotImplementedError


def test_an_undo_during_apply_names_what_it_could_not_restore(tables, monkeypatch):
    from kimi_hotfix.runtime import config
    own = vars(Thing)["first"]
    monkeypatch.setattr(state, "_config", config.parse(()))
    monkeypatch.setattr(registry, "_targets", {"kimi_halfway": HalfwayUndone.target})
    monkeypatch.setattr(registry, "_patches", {"kimi_halfway": HalfwayUndone()})
    tables._states["kimi_halfway"] = State(Kind.PENDING)
    core.settle("kimi_halfway", sys)
    assert tables.get("kimi_halfway") == State(
        Kind.DISABLED, "undone; could not restore Thing.first (replaced since)", undone=True)
    assert vars(Thing)["first"] is own
