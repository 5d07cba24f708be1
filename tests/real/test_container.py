"""Issue 36 item 1 on the real vLLM 0.29.0: the container whose bytecode
Python does not run (the stand-in matrix: tests/unit/test_container_matrix.py).

vLLM's KV-cache interface, parallel_state and VllmConfig copied with a
modification time a minute later than their ``.pyc`` files record (a copy, a
layer rebuild: harness.stale_tree), and no bytecode written
(``PYTHONDONTWRITEBYTECODE=1``). Python sees the ``.pyc`` is stale and runs the
source; before -O parity, the shim's recompiling patches read ``failed`` there
("differs from its bytecode") and vLLM's own -O merges ran. Now:

- armed by the bootstrap (``stale:O:0``): -O parity loads those modules with
  plain Python's bytecode (compiled from the source: nothing is written),
  every state reads applied, the Kimi-K3 grouping is plain Python's, and
  nothing is logged but the summary lines;
- armed late by vLLM's plugin loader (``late:O:0``, the same tree): the modules
  ran already, their stale ``.pyc`` unused; by Python's own rule the source is
  the running code's, so their functions get plain code in place: ``late``,
  not ``partial``.
"""

from __future__ import annotations

import pytest

from harness import STALE, child, reference, stale_tree
from helpers import warning_lines

pytestmark = pytest.mark.releases("0.29.0")
MODULES = [rel[:-3].replace("/", ".") for rel in STALE]


def test_a_stale_bytecode_container_reads_applied_and_runs_plain_python(release):
    run = child(release, "stale", "O")
    process = run["process"]
    assert process["optimize"] == 1
    assert process["kv_cache_interface_file"].startswith(str(stale_tree(release)))
    assert process["o_parity"].startswith("applied (package"), process["o_parity"]
    assert set(MODULES) <= set(process["plain_modules"]), process["plain_modules"]
    assert set(run.kinds.values()) == {"applied"}, run.states
    assert warning_lines(run.stderr) == [], run.stderr
    assert run["kv"]["groupings"] == reference()["kv"]["groupings"]
    assert run["kv"]["probe"]["ok"], run["kv"]["probe"]


def test_armed_late_on_stale_bytecode_the_modules_get_plain_code_in_place(release):
    late = child(release, "late", "O")
    state = late["process"]["o_parity"]
    assert late["process"]["kv_cache_interface_file"].startswith(str(stale_tree(release)))
    assert state.startswith("applied (late: ") and "given plain code in place" in state, state
    assert "kept -O's code" not in state, state
    assert warning_lines(late.stderr) == [], late.stderr
