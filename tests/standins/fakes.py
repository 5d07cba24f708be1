"""Stand-in patches for the core's mechanics (child side; no vLLM).

``Fake`` is a ``patching.Patch`` whose decision, check failure, apply steps and
failures are set per instance; its target is a stand-in module
``standin_<name>`` that the test writes (``MODULE``). ``register(*fakes)``
replaces the registry with them. A child imports this after start-up:
``sys.path.append(STANDINS); import fakes``.
"""

import json
import sys
import threading

from kimi_hotfix.runtime import patching, registry, state, wrapping

MODULE = ("class Thing:\n    def first(self):\n        return 'original'\n"
          "    def second(self):\n        return 'original'\n")


class Fake(patching.Patch):
    wraps = ("Thing.first", "Thing.second")  # each instance says its own

    def __init__(self, name, decision=None, raises=None, apply_fails=False, target=None,
                 attrs=("first", "second"), pause=None):
        self.name, self.target = name, target or "standin_" + name
        self.wraps = tuple(f"Thing.{a}" for a in attrs)
        self.decision, self.raises, self.apply_fails = decision, raises, apply_fails
        self.attrs, self.pause = attrs, pause  # pause: (reached, go) events after the first wrap
        self.ctx = None

    def decide(self, module, optimize):
        if self.raises:
            raise self.raises
        return self.decision

    def apply(self, module, ctx):
        self.ctx = ctx
        for i, attr in enumerate(self.attrs):
            if i == 1 and self.apply_fails:
                raise RuntimeError("second step failed")
            if i == 0:
                ctx.wrap(module.Thing, attr, lambda wrapped, instance, args, kwargs: "patched")
            else:
                ctx.wrap(module.Thing, attr, replacement=lambda self: "replaced")
            if i == 0 and self.pause:
                reached, go = self.pause
                reached.set()
                go.wait(30)

    def probe(self):
        return patching.ProbeResult(ok=True)


def register(*fakes):
    """The registry holds ``fakes`` only."""
    registry._targets.clear()
    registry._patches.clear()
    for fake in fakes:
        registry.add(fake)


def installed(module_name, attrs=("first", "second")):
    thing = sys.modules[module_name].Thing
    return [a for a in attrs if wrapping.is_wrapped(vars(thing)[a])]


def states():
    return {n: [s.kind.value, str(s)] for n, s in state.states().items()}


def emit(obj):
    print("KIMI_JSON:" + json.dumps(obj, default=repr), flush=True)


def events():
    return threading.Event(), threading.Event()
