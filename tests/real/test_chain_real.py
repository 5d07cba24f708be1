"""The bundle beside a checkout on PYTHONPATH, with the container's own
sitecustomize after both, on the real vLLM 0.29.0 under -O (issue 20 item 10;
every order of checkout, symlink and copy on the stand-in:
tests/unit/test_chain_identity.py).

One healthy child of the fault tier's real -O driver (tests/real/fault_child.py,
``chain``) puts the bundle first, a copy of the checkout next and
tests/standins/container_site last, runs the bootstrap as site.py does and
imports vLLM: the bundle's bootstrap runs, knows the checkout's as another copy
of itself, runs the container's exactly once, and each target is wrapped once.
"""

from __future__ import annotations

import os

import pytest
from test_fault_tier import driver

from helpers import STANDINS

pytestmark = pytest.mark.releases("0.29.0")


def test_bundle_beside_a_checkout_chains_the_containers_sitecustomize_once(release):
    run = driver("real", "O", release)["chain"]
    assert run["import_error"] is None, run["import_traceback"]
    chain = run["chain"]
    container = str(STANDINS / "container_site" / "sitecustomize.py")
    assert chain["site_log"] == ["container sitecustomize ran"]
    assert chain["sitecustomize"] == container and chain["chained"] == [container]
    # the bundle's bootstrap ran (it is first); the checkout's was found as a copy of it
    # (exact paths: both trees live under the session's cache, issue 30 item 1)
    assert chain["bootstrap"] == os.path.join(chain["bundle"], "sitecustomize.py"), chain
    assert chain["copies"] == [os.path.join(chain["checkout"], "sitecustomize.py")], chain
    assert chain["wrapped"] and {v["layers"] for v in chain["wrapped"].values()} == {1}
    assert run["states"]["kv_spec_merge"] == "applied"
