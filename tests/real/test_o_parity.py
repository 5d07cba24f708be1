"""The -O hazards that -O parity (kimi_hotfix.runtime.parity) covers, on the real wheels.

Per (release, plain or -O), the child that runs with the shim off
(KIMI_HOTFIX=0, harness.PLAN's ``off`` seed 0) computes these cases last, in
its ``o_parity`` section: "with" parity, the modules a case runs get their
plain code in place, as parity's late path does for a module imported before
the shim armed, and vLLM's code is put back after
(tests/real/child_o_parity.py). Each test shows plain Python and -O differing
without parity, and parity giving -O plain Python's behaviour, refusals
included, and nothing more. The early path (the finder, in every vLLM process
the bootstrap arms) is the shim's own children's: tests/real/test_check.py.
"""

from __future__ import annotations

import pytest

from harness import child

pytestmark = pytest.mark.releases("0.29.0", "0.30.0", "0.33.0")
NO_BARRIER = "AttributeError: 'NoneType' object has no attribute 'barrier'"
INTERLEAVE = ("AssertionError: Block_size(64) should be greater than or equal to and divisible "
              "by cp_kv_cache_interleave_size (128).")


def sections(release, opt):
    out = child(release, "off", "O" if opt else "plain")["o_parity"]
    broken = {k: v["error"] for k, v in out.items() if isinstance(v, dict) and set(v) == {"error"}}
    assert not broken, broken
    assert out["process"]["optimize"] == opt and out["process"]["vllm"] == release
    assert out["process"]["kimi_hotfix"] == "0"  # the shim armed nothing by itself
    return out


def test_cpu_offload_barrier_needs_the_getter_to_raise(release):
    plain, optimized = sections(release, 0)["barrier"], sections(release, 1)["barrier"]
    for case in (plain, optimized):  # a single-node worker: no inner-DP world group
        assert case["inner_dp_world"] is None and case["restored"] is True
    assert plain["without"] == "ok" and plain["getter_without"].startswith("AssertionError")
    # -O without the patch: the getter returns None, the barrier raises at worker start-up
    assert optimized["getter_without"] == "returned 'None'"
    assert optimized["without"] == NO_BARRIER
    # parity: plain Python's AssertionError, so the fallback to the world group runs
    assert optimized["getter_with"] == plain["getter_without"]
    assert optimized["with"] == plain["with"] == "ok"


def test_dcp_interleave_check_refuses_under_O_only_with_the_patch(release):
    plain, optimized = sections(release, 0)["config"], sections(release, 1)["config"]
    assert plain["misfit"] == {"without": INTERLEAVE, "with": INTERLEAVE}
    assert optimized["misfit"] == {"without": "ok", "with": INTERLEAVE}  # -O accepts the misfit
    for config in (plain, optimized):  # no new failure: what plain Python accepts stays accepted
        assert config["fit"] == {"without": "ok", "with": "ok"}
        assert config["default_config"] == {"without": "ok", "with": "ok"}


@pytest.mark.releases("0.30.0", "0.33.0")
def test_nixl_dcp_check_refuses_under_O_only_with_the_patch(release):
    plain, optimized = sections(release, 0)["config"]["nixl"], sections(release, 1)["config"]["nixl"]
    assert plain["present"] and optimized["present"]
    refused = "decode_context_parallel_size=4 must be 1 or equal to the NIXL transfer parallel size=8"
    assert plain["without"].startswith("ValidationError") and refused in plain["without"]
    assert plain["with"] == plain["without"]
    assert optimized["without"] == "ok"  # -O: the check is gone
    assert optimized["with"] == plain["without"]


def test_0_29_has_no_nixl_dcp_check():
    assert sections("0.29.0", 1)["config"]["nixl"] == {"present": False}


def test_decisions_and_probes(release):
    for opt in (0, 1):
        out = sections(release, opt)
        verdict = out["decide"]["o_parity"]["verdict"]
        assert verdict == ("needed" if opt else "not_affected"), out["decide"]
        probe = out["probes"]["o_parity"]
        assert probe["with"]["ok"] is True, probe
        assert probe["without"]["ok"] is (not opt), probe
        assert probe["with"]["cases"] == sections(release, 0)["probes"]["o_parity"]["without"]["cases"]


def test_planner_invariants_vanish_under_O_and_parity_restores_them(release):
    """Reachable at every start-up, different only when workers disagree or a
    grouping leaves a layer out: bare asserts no patch named, which parity
    restores with the rest."""
    plain, optimized = sections(release, 0)["planner"], sections(release, 1)["planner"]
    assert plain["where"] == optimized["where"]
    differ = plain["workers_differ"]["without"]
    assert differ.startswith("AssertionError: The KV cache specs for the same layer are "
                             "different across workers")
    assert plain["workers_differ"]["with"] == differ
    assert "different across workers" not in optimized["workers_differ"]["without"]
    assert optimized["workers_differ"]["with"] == differ
    if release == "0.33.0":
        missing = "AssertionError: KV cache groups miss layers: ['model.layers.1.attn']."
        assert plain["partition_misses_a_layer"] == {"without": missing, "with": missing}
        assert optimized["partition_misses_a_layer"] == {"without": "ok", "with": missing}
