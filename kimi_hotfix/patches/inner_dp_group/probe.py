"""inner_dp_group's probe: the getter, as installed now, outside a multi-node DP replica.

Imports vLLM (CPU is enough). In a process that has not set up vLLM's
distributed state (the ``check`` process), ``_INNER_DP_WORLD`` is None, which
is the state of a single-node worker: the getter must raise AssertionError
for ``_all_workers_barrier``'s fallback to run. Where the process has that
group (not the case in ``check``), the probe cannot tell.
"""

from __future__ import annotations

from kimi_hotfix.patching import ProbeResult


def run() -> ProbeResult:
    from vllm.distributed import parallel_state

    from kimi_hotfix.patches.inner_dp_group import GETTER

    if getattr(parallel_state, "_INNER_DP_WORLD", None) is not None:
        return ProbeResult(ok=None, error="this process has an inner-DP world group")
    if GETTER not in vars(parallel_state):
        return ProbeResult(ok=True, affected=False, detail=f"no {GETTER} in this vLLM")
    try:
        got = getattr(parallel_state, GETTER)()
    except AssertionError as exc:
        case = f"AssertionError: {exc}"
        return ProbeResult(ok=True, cases={"no inner-DP group": case},
                           detail="raises AssertionError: the barrier falls back to the world group")
    case = f"returns {got!r}"
    return ProbeResult(ok=False, cases={"no inner-DP group": case},
                       detail=f"{case}: the CPU-offload barrier fails with AttributeError")
