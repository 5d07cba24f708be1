"""kimi_hotfix.runtime.recompile: recompiling a function from its own source (shim
mechanics; stand-in functions in tests/standins/recompile_target).

Each case runs in a child interpreter, plain, -O and -OO:
- the pristine recompilation is the running function (same constants, names,
  locals, first line; multi-line strings are not dedented; the decorated def
  keeps its number), and behaves the same, asserts included (stripped under -O
  exactly as in the running code);
- an edit lands where asked and its helpers arrive as closure cells, not as
  module globals; an exception raised by vLLM's own statements still points at
  the line of the source file;
- ``optimize=0`` keeps asserts under -O (what kv_spec_merge relies on);
- the same on every Python: a nested def's evaluated annotations, a nested
  class's qualified name and a module-level function calling itself by name
  compile as in the running code;
- a def whose signature closes at its own indentation is cut from the file
  without parsing the module; a call on a name imported inside a block (not
  at column 0) compiles as in the module;
- a function whose running code differs from its source, a closure, a missing
  source: PatchError, nothing is produced.
"""

from __future__ import annotations

import pytest

from helpers import OPT_FLAGS, REPO, STANDINS, hermetic_env, json_lines, run_python

CHILD = r"""
import ast, inspect, json, sys, traceback
sys.path.insert(0, %(target)r)
import sample
from kimi_hotfix.runtime import recompile
from kimi_hotfix.runtime.base import PatchError

out = {"optimize": sys.flags.optimize}
merge = vars(sample.Sample)["merge"].__func__
build = vars(sample.Sample)["build"]

def outcome(call):
    try:
        return ["ok", call()]
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return [type(exc).__name__, str(exc), tb.filename == sample.__file__, tb.line]

same = recompile.recompile(merge, lambda tree: None)
out["same_consts"] = same.__code__.co_consts == merge.__code__.co_consts
out["same_firstlineno"] = [same.__code__.co_firstlineno, merge.__code__.co_firstlineno]
out["merge"] = [[outcome(lambda: f(sample.Sample, x)) for x in (1, -1)] for f in (merge, same)]
out["merge_doc"] = same.__doc__ == merge.__doc__ and same.__qualname__ == merge.__qualname__

hardened = recompile.recompile(merge, lambda tree: None, optimize=0)
out["merge_optimize0"] = outcome(lambda: hardened(sample.Sample, -1))

def insert_call(tree):
    guard = ast.parse("common_attn_metadata, num_decode_draft_tokens_cpu = "
                      "_helper(common_attn_metadata, num_decode_draft_tokens_cpu)").body
    tree.body[0].body[:0] = guard

edited = recompile.recompile(build, insert_call,
                             cells={"_helper": lambda a, d: (a + 1, "from helper")})
out["edited"] = [outcome(lambda: edited(None, x)) for x in (1, -5)]
out["helper_not_global"] = "_helper" not in vars(sample)
out["edited_freevars"] = list(edited.__code__.co_freevars)

out["signature_cut"] = recompile._own_block(sample.signature.__code__) is not None
for name, func, args in (("nested", sample.Sample.nested, (None, 2)),
                         ("countdown", sample.countdown, (3,)),
                         ("signature", sample.signature, ([1],))):
    try:
        again = recompile.recompile(func, lambda tree: None)
        out[name] = [again(*args) == func(*args), again(*args), list(again.__code__.co_freevars)]
    except PatchError as exc:
        out[name] = "PatchError: " + str(exc)

for name, func in (("swapped", sample.Sample.swapped), ("closure", sample.closure_maker()),
                   ("builtin", len)):
    try:
        recompile.recompile(func, lambda tree: None)
        out[name] = "recompiled"
    except PatchError as exc:
        out[name] = "PatchError: " + str(exc)
print("KIMI_JSON:" + json.dumps(out))
"""


@pytest.mark.parametrize("flags", list(OPT_FLAGS.values()), ids=list(OPT_FLAGS))
def test_recompile_mechanics(flags):
    code = CHILD % {"target": str(STANDINS / "recompile_target")}
    proc = run_python(["-c", code], flags=flags, env=hermetic_env(), cwd=REPO)
    out = json_lines(proc.stdout)[0]
    assert out["optimize"] == (flags[0].count("O") if flags else 0)
    assert out["same_consts"] is True
    first, running = out["same_firstlineno"]
    assert first == running
    original, recompiled = out["merge"]
    assert recompiled == original
    text = "first line\nnot indented: dedenting the source would change this string"
    assert original[0] == ["ok", [text, 1]]
    if flags:  # -O strips the assert in the running code and in the recompilation alike
        assert original[1] == ["ok", [text, -1]]
    else:
        assert original[1][:3] == ["AssertionError", "x must be positive", True]
    assert out["merge_doc"] is True
    # optimize=0: the assert stays, on its own source line
    assert out["merge_optimize0"] == ["AssertionError", "x must be positive", True,
                                      'assert x > 0, "x must be positive"']
    assert out["edited"][0] == ["ok", [4, "from helper"]]
    assert out["edited"][1] == ["ValueError", "negative input", True,
                                'raise ValueError("negative input")']
    assert out["helper_not_global"] is True
    assert out["edited_freevars"] == ["_helper"]
    # the nested class keeps vLLM's qualified name, the recursion its global
    assert out["nested"] == [True, [[[0], [2]], "Sample.nested.<locals>.Box", 2], []]
    assert out["countdown"] == [True, [3, 2, 1], []]
    # a multi-line signature is cut without parsing the module; a call on a
    # name imported inside a block compiles as in the module (3.11+ compiles
    # ``imported.attr()`` differently), found after the column-0 guess missed it
    assert out["signature_cut"] is True
    assert out["signature"] == [True, "[1]", []]
    assert out["swapped"] == "PatchError: source of Sample.swapped does not match its running code"
    assert out["closure"].startswith("PatchError: closure_maker.<locals>.uses_closure uses a closure")
    assert out["builtin"].startswith("PatchError: ")


ASSERT_SHAPES = '''
def f(x):
    assert x
    if x:
        assert x, "if"
    else:
        assert not x
    for i in x:
        assert i
    else:
        assert x
    while x:
        assert x
    try:
        assert x
    except ValueError:
        assert x
    else:
        assert x
    finally:
        assert x
    with x:
        assert x
    def inner():
        assert x
        class C:
            assert x
            def m(self):
                assert self
    y = lambda: x  # an expression holds no statement
    return [assert_ for assert_ in x]
'''
MATCH_SHAPE = '''
def g(x):
    match x:
        case 1:
            assert x
        case _:
            assert not x
'''


def test_asserts_in_counts_every_assert_statement_as_ast_walk_does():
    import ast
    import sys

    sys.path.insert(0, str(REPO))
    from kimi_hotfix.runtime import recompile
    sources = [ASSERT_SHAPES] + ([MATCH_SHAPE] if sys.version_info >= (3, 10) else [])
    for text in sources:
        tree = ast.parse(text)
        walked = sum(isinstance(n, ast.Assert) for n in ast.walk(tree))
        assert walked > 0
        assert recompile.asserts_in(tree) == walked
    assert recompile.asserts_in(ast.parse("def h():\n    return 'assert x'  # assert y\n")) == 0
