"""inner_dp_group: the CPU KV-offload barrier falls back to the world group under ``-O`` too.

Why: ``vllm/v1/kv_offload/cpu/spec.py``'s ``_all_workers_barrier`` (CPU KV
offload on CUDA/XPU: every worker maps the shared offload region, then waits
for the others) asks ``get_inner_dp_world_group()`` for its group and falls back
to the world group on AssertionError. That getter guards with a bare ``assert``:
the inner-DP world group exists only when one data-parallel replica spans
several nodes (``parallel_config.nnodes_within_dp > 1``). Single-node servers,
and multi-node servers under Ray (``nnodes`` stays 1 there), do not have it.
Plain Python: the assert fires and the barrier runs on the world group. ``python
-O``: the getter returns None and ``None.barrier()`` fails with
``AttributeError: 'NoneType' object has no attribute 'barrier'`` when the
worker is created: the server does not start (tests/real/test_o_parity.py
shows both on the real wheels, with a one-process gloo world).

What it changes: ``vllm.distributed.parallel_state.get_inner_dp_world_group`` is
recompiled from vLLM's own source with its ``assert`` written as ``if not ...:
raise AssertionError(...)`` (kimi_hotfix.hardening), on its first call in a
process; it then raises the AssertionError plain Python raises, and the
caller's fallback works. Where the group exists nothing changes. Restoring the
AssertionError is plain-Python behaviour, not a new failure: every other caller
(the multiprocessing executor, at start-up) fails under plain Python too.

Upstream: no PR yet; fixed by no release up to 0.33.0 (measured: 0.29.0, 0.30.0,
0.33.0 have the same getter). The fix for vLLM:
upstream/0002-parallel-state-inner-dp-getter-explicit-check.patch.

Needed when (``check``): under ``-O``, the getter's source still holds an
``assert`` (a structural check on its parsed source). Without ``-O`` the assert
is live: not affected. No getter: not affected. No source: cannot tell, and
nothing to recompile: ``failed`` (vLLM's getter runs). Another library's
wrapper on the getter: the decision reads vLLM's own function beneath it, and
the shim installs beneath it (kimi_hotfix.wrapping.chain).
"""

from __future__ import annotations

from kimi_hotfix import hardening, patching

GETTER = "get_inner_dp_world_group"


def getter(module):
    return hardening.require(module, GETTER)


def decide(module, optimize) -> patching.Decision:
    """The decision, from the loaded parallel_state module (plain function:
    ported as is)."""
    if GETTER not in vars(module):
        return patching.absent(f"no {GETTER} in this vLLM")
    if not optimize:
        return patching.absent("python without -O keeps the getter's assert: the CPU-offload "
                           "barrier's fallback works")
    count = hardening.asserts(getter(module))
    if count is None:
        return patching.cannot_tell(f"source of {GETTER} unavailable")
    if count == 0:
        return patching.fixed(f"{GETTER} checks without assert")
    return patching.needed(f"-O strips {GETTER}'s assert: the CPU-offload barrier gets None "
                       "instead of falling back to the world group")


def install(module, ctx):
    func = getter(module)
    ctx.wrap(module, GETTER, hardening.OnFirstCall(ctx, [func]).wrapper(func))


class InnerDpGroupPatch(patching.Patch):
    name = "inner_dp_group"
    target = "vllm.distributed.parallel_state"
    wraps = (GETTER,)
    upstream = "no PR yet (upstream/0002-parallel-state-inner-dp-getter-explicit-check.patch)"
    fixed_in = ""
    asserts_measured_up_to = "0.33.0"
    symptoms = ("AttributeError: 'NoneType' object has no attribute 'barrier'",
                "at worker start-up with CPU KV offload (python -O)")
    summary = "under -O the inner-DP group getter raises: the CPU-offload barrier falls back"
    decides = f"under -O: a source check for the assert in {GETTER}"
    probe_title = f"{GETTER}() outside a multi-node DP replica: raises or returns None"

    def check(self, module, optimize):
        return decide(module, optimize)

    def apply(self, module, ctx):
        return install(module, ctx)


    def expect(self, version, optimize):
        if version is None:
            return super().expect(version, optimize)
        if not optimize:
            return self.expect_plain_unaffected(version, "the getter's assert is live")
        return self.expect_optimized(version, GETTER)

    def probe(self):
        return patching.run_probe(self)  # probe.py, beside this file


PATCH = InnerDpGroupPatch()
