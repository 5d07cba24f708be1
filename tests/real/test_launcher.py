"""Arming under a launcher that shadows the bootstrap (issue 32), on the real vLLM 0.29.0 under -O.

An APM launcher (``opentelemetry-instrument``) puts its own ``sitecustomize``
first on PYTHONPATH, and it does not run the next one: the shim's bootstrap
never runs. The shim's directory also carries ``kimi_hotfix-<version>.dist-info``
with the ``vllm.general_plugins`` entry point, so vLLM's own plugin loader arms
it in every process that loads plugins (API server, EngineCore, workers), later
than the bootstrap would: after vLLM has imported the targets.

Here the worst case of that lateness: the stand-in launcher's sitecustomize
(tests/standins/apm_site) first on PYTHONPATH, every target imported before
anything of the shim, then ``vllm.plugins.load_general_plugins()`` (the
``late:O:0`` child). Every state, every wrapped method, the Kimi-K3 grouping,
the capture plans and the KDA builds must be those of the child whose bootstrap
armed the shim before vLLM's first import (``on:O:0``). The real launcher, in a
live server: tests/e2e (``sf-O-otel``).
"""

from __future__ import annotations

import pytest

from harness import child
from helpers import TARGETS, summaries

pytestmark = pytest.mark.releases("0.29.0")


def test_shadowed_bootstrap_arms_late_through_the_dist_info_and_every_fix_lands(release):
    late, early = child(release, "late", "O"), child(release, "on", "O")
    info = late["process"]["late"]
    # the launcher's sitecustomize ran, the bootstrap did not, nothing armed the shim
    # before every target was imported
    assert info["apm_sitecustomize"].endswith("tests/standins/apm_site/sitecustomize.py")
    assert info["bootstrap_loaded"] is False and info["armed_before"] is False
    assert info["targets_imported_before"] == list(TARGETS)
    assert late["process"]["armed_by"] == ["vllm-plugin"]
    assert early["process"]["armed_by"][0] == "sitecustomize"
    # true states: what the early arming says, patch by patch
    assert late.states == early.states and set(late.kinds.values()) == {"applied"}, late.states
    # and the fixes landed: the same wrappers, groupings, plans and builds
    assert late["wrapped"] == early["wrapped"]
    assert late["kv"] == early["kv"]
    assert late["plans"] == early["plans"]
    assert late["kda"] == early["kda"]
    # the line says it, once armed: the plugin's arming settles every imported target at once
    (lines,) = summaries(late.start_stderr).values()
    assert lines[-1].endswith(" | ".join(f"{p}: {s}" for p, s in late.states.items())), lines
