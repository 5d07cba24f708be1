"""Only the command line narrows the real tier.

A deselected test is not a skip, so the no-skip rule cannot see a narrowed
run: the full tier must select every release whatever the environment holds
(a stray ``KIMI_HOTFIX_RELEASES``, once read here, is ignored), and
``--release`` narrows it and says so in the header. Collection only: a session
that runs nothing starts no vLLM child.
"""

from __future__ import annotations

import re
import sys

from harness import PLAN, RELEASES, SHIM_RUNS
from helpers import REPO, hermetic_env, run_python


def collected(*args, **env):
    proc = run_python(["-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                       "tests/real/test_kv_spec_merge.py", *args],
                      python=sys.executable, cwd=REPO, env=hermetic_env(shim=False, **env),
                      timeout=300)
    ids = [line.strip() for line in proc.stdout.splitlines()
           if "::" in line or "<Function " in line]  # -q lists ids, the default a tree
    releases = {m.group(1) for line in ids
                for m in [re.search(r"\[(\d{4}(?:-py3\d+)?)[-\]]", line)] if m}
    return ids, releases, proc.stdout


def test_the_environment_cannot_narrow_the_tier():
    ids, releases, _ = collected(KIMI_HOTFIX_RELEASES="0.29.0")
    shown = {r.replace(".", "") for r in RELEASES if r != "0.28.0"}  # 0.28.0 has no merge test
    assert releases == shown, ids
    # every configuration harness.PLAN runs for a release has its grouping test
    grouping = [i for i in ids if "test_shim_groups_like_the_reference" in i]
    assert len(grouping) == sum(len(set(PLAN[r]) & set(SHIM_RUNS)) for r in RELEASES
                                if r != "0.28.0")


def test_release_narrows_and_says_so():
    ids, releases, out = collected("--release", "0.30.0", "-v")
    assert releases == {"0300"}, ids
    assert "real vLLM releases (--release): 0.30.0" in out
