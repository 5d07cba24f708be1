"""kimi_hotfix.hardening: asserts as explicit raises, built on the first call
(shim mechanics; stand-ins in tests/standins/hardening_target). The -O cases run
in child interpreters."""

from __future__ import annotations

import pytest

from helpers import OPT_FLAGS, STANDINS, hermetic_env, json_lines, run_python

CHILD = r"""
import json, sys, threading
sys.path.insert(0, %(target)r)
import hsample
from kimi_hotfix import core, hardening, state, wrapping
core.arm("test")  # the contexts report failures to the shim's state

out = {"optimize": sys.flags.optimize}
check = vars(hsample.Config)["check"]
out["asserts"] = {"getter": hardening.asserts(hsample.getter),
                  "no_assert": hardening.asserts(hsample.no_assert),
                  "check": hardening.asserts(check), "builtin": hardening.asserts(len)}
out["checks"] = {"narrowing": [hardening.asserts(hsample.narrowing),
                               hardening.checks(hsample.narrowing)],
                 "getter": hardening.checks(hsample.getter), "builtin": hardening.checks(len)}

def outcome(call):
    try:
        return ["ok", call()]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]

out["unpatched"] = [outcome(hsample.getter), outcome(lambda: hsample.Config(5).check(3))]
records = []
ctx = wrapping.PatchContext("standin", records, core.load_wrapt, core.wrapper_failed, core.spent)
lazy = hardening.OnFirstCall(ctx, [hsample.getter, check])
out["built_before_call"] = lazy.impls is not None
ctx.wrap(hsample, "getter", lazy.wrapper(hsample.getter))
ctx.wrap(hsample.Config, "check", lazy.wrapper(check))
results = []
threads = [threading.Thread(target=lambda: results.append(outcome(hsample.getter))) for _ in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
out["threads"] = results
out["patched"] = [outcome(hsample.getter), outcome(lambda: hsample.Config(5).check(3)),
                  outcome(lambda: hsample.Config(2).check(3) is not None),
                  outcome(lambda: hsample.Config.check(hsample.Config(5), limit=3))]
out["built_once"] = sorted(f.__qualname__ for f, impl in lazy.impls.items() if impl is not None)
out["left"] = wrapping.uninstall(records)
out["restored"] = (hsample.getter.__module__ == "hsample"
                   and not core.is_wrapped(vars(hsample.Config)["check"]))

# a function whose running code is not its source: the wrapper logs once and runs vLLM's own
def broken():
    assert STATE is None, "never"
broken.__code__ = hsample.no_assert.__code__.replace(co_name="broken")
failing = hardening.OnFirstCall(
    wrapping.PatchContext("standin-broken", [], core.load_wrapt, core.wrapper_failed, core.spent),
    [hsample.getter])
failing.funcs = [broken]
wrapper = failing.wrapper(broken)
out["broken"] = [outcome(lambda: wrapper(broken, None, (1,), {})) for _ in range(2)]
out["broken_state"] = str(state.get("standin-broken"))
print("KIMI_JSON:" + json.dumps(out))
"""


def run(opt):
    target = str(STANDINS / "hardening_target")
    proc = run_python(["-c", CHILD % {"target": target}], flags=OPT_FLAGS[opt], env=hermetic_env())
    return json_lines(proc.stdout)[-1], proc.stderr


@pytest.mark.parametrize("opt", ["plain", "O", "OO"])
def test_first_call_hardening_gives_plain_python_behaviour(opt):
    out, stderr = run(opt)
    assert out["optimize"] == {"plain": 0, "O": 1, "OO": 2}[opt]
    # counted from the parsed source: a string line and a nested def's assert included/ignored right
    assert out["asserts"] == {"getter": 1, "no_assert": 0, "check": 2, "builtin": None}
    # checks(): less the message-less isinstance / "is not None" asserts (config_checks decides on it)
    assert out["checks"] == {"narrowing": [4, 2], "getter": 1, "builtin": None}
    refused = ["AssertionError", "group is not initialized"]
    over = ["AssertionError", "size 5 over 3"]
    if opt == "plain":
        assert out["unpatched"] == [refused, over]
    else:  # -O strips both asserts: vLLM's own code accepts
        assert out["unpatched"][0] == ["ok", None] and out["unpatched"][1][0] == "ok"
    assert out["built_before_call"] is False  # nothing compiled at apply time
    assert out["threads"] == [refused] * 4
    assert out["patched"] == [refused, over, ["ok", True], over]
    assert out["built_once"] == ["Config.check", "getter"]
    assert out["restored"] is True and out["left"] == []
    # a source that does not match: logged once, vLLM's own function runs (no_assert: 1 + 1),
    # and every call that ran it is counted (two calls: 2; issue 20 item 3)
    assert out["broken"] == [["ok", 2], ["ok", 2]]
    assert stderr.count("standin-broken wrapper failed") == 1
    assert out["broken_state"].startswith("applied; its code failed on 2 calls (first: PatchError")
