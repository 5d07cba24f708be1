"""kimi_hotfix.hardening in-process, on a module written at test time: what
``require`` and ``OnFirstCall`` refuse and say, keyword arguments and bound
methods through the first-call wrapper, and the cost it records. The -O/-OO
behaviour and the threads: test_hardening.py, in child interpreters."""

from __future__ import annotations

import types

import pytest

from kimi_hotfix import core, hardening, state
from kimi_hotfix.base import PatchError

from helpers import sample_module

SOURCE = '''
def limited(size, limit=3):
    assert size <= limit, f"size {size} over {limit}"
    return size


class Outer:
    class Inner:
        def method(self, x, *, scale=1):
            assert x, "x is falsy"
            return x * scale

        not_a_function = len
'''


class Ctx:
    """The part of a PatchContext that OnFirstCall uses."""

    name = "standin"

    def __init__(self):
        self.failures = []

    def failed(self, exc, instead):
        self.failures.append((exc, instead))

    def spent(self, phase, seconds):  # the core's account (core.spent), as PatchContext passes it
        core.spent(phase, seconds)


@pytest.fixture
def sample(tmp_path, monkeypatch):
    yield from sample_module(tmp_path, monkeypatch, "kimi_hsample_units", SOURCE)


def test_require_gives_the_plain_function_or_names_what_is_missing(sample):
    inner = sample.Outer.Inner
    assert hardening.require(inner, "method") is vars(inner)["method"]
    with pytest.raises(PatchError) as raised:
        hardening.require(inner, "not_a_function")
    assert str(raised.value) == "Outer.Inner.not_a_function not found (or not a plain function)"
    with pytest.raises(PatchError) as raised:
        hardening.require(inner, "absent")
    assert str(raised.value) == "Outer.Inner.absent not found (or not a plain function)"
    with pytest.raises(PatchError) as raised:  # a module: its __name__
        hardening.require(sample, "absent")
    assert str(raised.value) == "kimi_hsample_units.absent not found (or not a plain function)"
    holder = types.SimpleNamespace(other=1)  # neither: the object itself
    with pytest.raises(PatchError) as raised:
        hardening.require(holder, "absent")
    assert str(raised.value) == f"{holder}.absent not found (or not a plain function)"


def test_a_function_without_source_is_refused_when_wrapped():
    code = compile("def nosource():\n    assert False, 'x'\n", "<kimi-no-such-file>", "exec")
    namespace = {}
    exec(code, namespace)
    with pytest.raises(PatchError) as raised:
        hardening.OnFirstCall(Ctx(), [namespace["nosource"]])
    assert str(raised.value) == ("source of nosource unavailable (<kimi-no-such-file>): "
                                 "nothing to recompile its asserts from")


def test_the_first_call_builds_and_passes_every_argument(sample):
    method = vars(sample.Outer.Inner)["method"]
    ctx = Ctx()
    lazy = hardening.OnFirstCall(ctx, [sample.limited, method])
    assert lazy.impls is None and lazy.failure is None and lazy.name == "standin"
    before = state.cost().get("first_call", 0.0)
    wrapper = lazy.wrapper(sample.limited)
    assert wrapper.__qualname__ == "kimi_hotfix.standin[limited]"
    assert wrapper(sample.limited, None, (2,), {"limit": 5}) == 2
    assert state.cost()["first_call"] > before  # its one recompile, counted
    with pytest.raises(AssertionError, match="^size 6 over 5$"):
        wrapper(sample.limited, None, (6,), {"limit": 5})
    with pytest.raises(AssertionError, match="^size 4 over 3$"):
        wrapper(sample.limited, None, (4,), {})
    bound = lazy.wrapper(method)
    assert bound.__qualname__ == "kimi_hotfix.standin[Outer.Inner.method]"
    obj = sample.Outer.Inner()
    assert bound(method, obj, (3,), {"scale": 2}) == 6
    with pytest.raises(AssertionError, match="^x is falsy$"):
        bound(method, obj, (0,), {})
    assert set(lazy.impls) == {sample.limited, method} and None not in lazy.impls.values()
    assert lazy.failure is None and ctx.failures == []


def test_a_failed_build_runs_vllms_own_function_and_reports_each_call(sample):
    ctx = Ctx()
    lazy = hardening.OnFirstCall(ctx, [sample.limited], instead="the original runs")
    lazy.funcs = [types.FunctionType(sample.limited.__code__.replace(co_name="renamed"),
                                     vars(sample))]  # its source no longer matches
    wrapper = lazy.wrapper(lazy.funcs[0])
    calls = []
    assert wrapper(lambda *a, **k: calls.append((a, k)) or "own", None, (9,), {"limit": 1}) == "own"
    assert calls == [((9,), {"limit": 1})]
    (exc, instead), = ctx.failures
    assert isinstance(exc, PatchError) and instead == "the original runs"
    assert lazy.failure is exc
