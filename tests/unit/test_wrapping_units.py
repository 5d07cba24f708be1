"""kimi_hotfix.runtime.wrapping in-process, on a module written at test time and the
installed wrapt: how the shim's wrapper pickles and copies (a module function
by reference, a class's function by getattr on its class, nested classes
included, a bound method as Python pickles methods), and PatchContext.wrap
beneath another library's ``functools.wraps`` wrapper, with the message when
it cannot. Pickling through vLLM: tests/real/test_processes.py."""

from __future__ import annotations

import copy
import functools
import pickle

import pytest
import wrapt

from kimi_hotfix.runtime import wrapping
from kimi_hotfix.runtime.base import PatchError

from helpers import sample_module

SOURCE = '''
def top(x):
    return x + 1


class Outer:
    class Inner:
        def method(self, x):
            return x * 2
'''


@pytest.fixture
def sample(tmp_path, monkeypatch):
    yield from sample_module(tmp_path, monkeypatch, "kimi_wsample_units", SOURCE)


def passthrough(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def test_the_wrapper_pickles_and_copies_as_what_it_wraps(sample, monkeypatch):
    monkeypatch.setattr(wrapping, "_classes", {})  # built here, not taken from an earlier test
    cls = wrapping.wrapper_class(wrapt)
    assert wrapping.wrapper_class(wrapt) is cls  # one class per wrapt module
    assert cls.__name__ == "KimiHotfixWrapper"
    top = cls(sample.top, passthrough)
    sample.top = top
    assert top.__reduce_ex__(2) == "top" and top.__reduce__() == "top"
    assert pickle.loads(pickle.dumps(top)) is top  # by reference: what the module holds
    assert copy.copy(top) is top and copy.deepcopy(top) is top and copy.deepcopy([top])[0] is top

    inner = sample.Outer.Inner
    method = cls(vars(inner)["method"], passthrough)
    inner.method = method
    assert method.__reduce_ex__(2) == (getattr, (inner, "method"))
    assert method.__reduce__() == (getattr, (inner, "method"))
    obj = inner()
    bound = obj.method
    assert type(bound).__name__ == "KimiHotfixBoundWrapper" and bound(4) == 8
    assert bound.__reduce_ex__(2) == (getattr, (obj, "method"))
    assert copy.copy(bound) is bound


def test_wrap_goes_beneath_a_functools_wraps_wrapper(sample):
    own = sample.top

    def other_library(func):
        @functools.wraps(func)
        def outer(*args, **kwargs):
            return func(*args, **kwargs) * 10
        return outer

    sample.top = other_library(own)
    assert wrapping.vllm_own(sample, "top") is own
    records = []
    ctx = wrapping.PatchContext("standin", records, lambda: wrapt, lambda *a: None)
    proxy = ctx.wrap(sample, "top", lambda wrapped, instance, args, kwargs: wrapped(*args) + 100)
    assert sample.top(1) == (1 + 1 + 100) * 10  # both run: theirs above, the shim's beneath
    assert wrapping.own_marker(proxy) == "standin" and wrapping.vllm_own(sample, "top") is own
    assert [r.qualname for r in records] == ["kimi_wsample_units.top"]
    assert ctx.wrap(sample, "top", passthrough) is None and ctx.skipped == ["top"]  # never twice
    assert wrapping.uninstall(records) == [] and sample.top(1) == 20


def test_a_wrapper_whose_closure_does_not_hold_the_function_is_refused(sample):
    own = sample.top
    table = {"f": own}

    @functools.wraps(own)
    def indirect(*args):
        return table["f"](*args)

    sample.top = indirect
    ctx = wrapping.PatchContext("standin", [], lambda: wrapt, lambda *a: None)
    with pytest.raises(PatchError) as raised:
        ctx.wrap(sample, "top", passthrough)
    where = indirect.__code__.co_filename
    assert str(raised.value) == (  # functools.wraps gave it the wrapped function's names
        f"kimi_wsample_units.top is wrapped by kimi_wsample_units.top ({where}), "
        "whose closure does not hold vLLM's own function in one cell: the shim cannot run beneath it")
