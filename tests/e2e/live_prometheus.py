"""A real Prometheus (Debian's package, scripts/get-prometheus) scraping one
live vLLM server with the shipped alert rules (deploy/prometheus), on
127.0.0.1 and a free port, with a bounded lifetime: it runs under
``timeout`` (so it dies even if the test process does) and is stopped as soon
as its answers are read. Stdlib only."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from serving import REPO, free_port

RULES = REPO / "deploy" / "prometheus" / "kimi-hotfix.rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "kimi-hotfix.rules.test.yml"
LIFETIME_S = 120  # the most a Prometheus of the tests lives
EVALUATIONS = 3  # rule evaluations to wait for after the first scrape with samples
# KimiHotfixRemovable waits 30 minutes (its promtool tests hold that); a live
# Prometheus lives two, so it loads the rules with that one ``for`` shortened,
# the expression and every other rule as shipped (live_rules checks it)
REMOVABLE, LIVE_FOR = "KimiHotfixRemovable", "2s"
SETTLE_S = 8  # the most it waits for a pending KimiHotfixRemovable to fire

_bin = None


def bindir() -> Path:
    """Where prometheus and promtool are: ``KIMI_HOTFIX_PROMETHEUS_BIN`` (the
    test command sets it), else scripts/get-prometheus."""
    global _bin
    if _bin is None:
        found = os.environ.get("KIMI_HOTFIX_PROMETHEUS_BIN")
        if not found:
            proc = subprocess.run([str(REPO / "scripts" / "get-prometheus")], capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"scripts/get-prometheus failed:\n{proc.stderr[-3000:]}")
            found = proc.stdout.strip().splitlines()[-1]
        _bin = Path(found)
    return _bin


def _get(base: str, path: str, **params):
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode()
    return json.loads(body) if path.startswith("/api/") else body


def live_rules(workdir: Path) -> Path:
    """The shipped rules with KimiHotfixRemovable's ``for`` set to ``LIVE_FOR``;
    everything else byte for byte (raises if the rule's shape changed)."""
    text = RULES.read_text()
    head, sep, tail = text.partition(f"- alert: {REMOVABLE}\n")
    rule, nxt, rest = tail.partition("\n      - alert: ")
    if not sep or rule.count("\n        for: 30m\n") != 1:
        raise RuntimeError(f"{RULES}: {REMOVABLE} has no single 'for: 30m'")
    out = workdir / "rules-live.yml"
    out.write_text(head + sep + rule.replace("\n        for: 30m\n", f"\n        for: {LIVE_FOR}\n")
                   + nxt + rest)
    return out


def evaluate(target: str, workdir: Path) -> dict:
    """Start Prometheus on ``target`` (host:port), wait until it has scraped the
    shim's or vLLM's series and evaluated the rules ``EVALUATIONS`` times, then
    return its alerts and the series it holds, and stop it."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(live_rules(workdir))],
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [target]}]}],
    }))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(workdir / "prometheus.log", "w")
    data = tempfile.mkdtemp(dir=workdir, prefix="tsdb-")
    proc = subprocess.Popen(
        ["timeout", "-s", "KILL", str(LIFETIME_S), str(bindir() / "prometheus"),
         f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    try:
        deadline = started + LIFETIME_S - 20
        scraped_at = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {proc.returncode}: "
                                   f"{(workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                up = _get(base, "/api/v1/query", query='up{job="vllm"} == 1')["data"]["result"]
                have = _get(base, "/api/v1/query", query="count(vllm:num_requests_running)")
            except OSError:
                time.sleep(0.3)
                continue
            if up and have["data"]["result"]:
                scraped_at = scraped_at or time.monotonic()
                rules = _get(base, "/api/v1/rules")["data"]["groups"]
                last = max((g.get("lastEvaluation", "") for g in rules), default="")
                if time.monotonic() - scraped_at >= EVALUATIONS and last:
                    break
            time.sleep(0.3)
        else:
            raise RuntimeError("prometheus never scraped the server")
        settle = time.monotonic() + SETTLE_S
        while True:  # a pending KimiHotfixRemovable fires LIVE_FOR later, or is gone
            alerts = _get(base, "/api/v1/alerts")["data"]["alerts"]
            if time.monotonic() > settle or not any(
                    a["labels"]["alertname"] == REMOVABLE and a["state"] == "pending" for a in alerts):
                break
            time.sleep(0.5)
        series = {q: [r["metric"] for r in _get(base, "/api/v1/query", query=q)["data"]["result"]]
                  for q in ("kimi_hotfix_info", 'kimi_hotfix_patch_state == 1',
                            "kimi_hotfix_cost_seconds")}
        version = _get(base, "/api/v1/status/buildinfo")["data"]["version"]
        return {"alerts": [{"name": a["labels"]["alertname"], "state": a["state"],
                            "labels": a["labels"]} for a in alerts],
                "series": series, "version": version,
                "seconds": round(time.monotonic() - started, 1)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
