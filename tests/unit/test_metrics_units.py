"""kimi_hotfix.runtime.metrics' pure parts in-process: a process's record and what
the collector accepts as one, the record's file name, the vLLM version it
reports, and the role of the process answering a scrape. The pod directory
under hostile conditions: test_hostile_host.py; /metrics itself (it needs
prometheus_client, which the unit tier does not have): the e2e tier."""

from __future__ import annotations

import os
import sys
import types

import pytest

from kimi_hotfix.runtime import config, core, metrics, scrape, state, versions


def good():
    return {"pid": 7, "start": "123", "role": "EngineCore",
            "info": {"version": "0.1.0", "vllm": "0.29.0", "python": "3.11", "enabled": "true",
                     "armed_by": "sitecustomize", "o_parity": "package"},
            "states": {"kv_spec_merge": "applied"}, "cost": {"arm": 0.5}}


def test_shape_accepts_a_record_and_refuses_each_bad_part():
    assert scrape._shape(good()) is True
    assert scrape._shape(dict(good(), cost={})) is True  # phases not reached yet
    bad = [dict(good(), role=1), dict(good(), states={"kv_spec_merge": "sideways"}),
           dict(good(), states=[]), dict(good(), cost=[]), dict(good(), cost={"arm": "x"}),
           dict(good(), info=dict(good()["info"], vllm=None)), dict(good(), info=None), [], None,
           dict(good(), info={k: v for k, v in good()["info"].items() if k != "o_parity"})]
    for rec in bad:
        assert scrape._shape(rec) is False, rec


def test_record_name_needs_a_start_time_and_a_namespace(monkeypatch):
    monkeypatch.setattr(metrics, "_pid_ns", lambda: "4026531836")
    assert metrics._record_name({"pid": 7, "start": "123"}) == "7-123-4026531836.json"
    assert metrics._record_name({"pid": 7, "start": ""}) == ""
    monkeypatch.setattr(metrics, "_pid_ns", lambda: "")
    assert metrics._record_name({"pid": 7, "start": "123"}) == ""


def test_the_vllm_version_is_the_loaded_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.29.0+cpu"))
    assert versions.vllm_version() == "0.29.0+cpu"
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=""))
    monkeypatch.setitem(sys.modules, "vllm.version", types.SimpleNamespace(__version__="0.30.0"))
    assert versions.vllm_version() == "0.30.0"


@pytest.mark.parametrize("switch, enabled", [(None, "true"), ("1", "true"), ("0", "false")])
def test_record_says_what_this_process_exports(monkeypatch, switch, enabled):
    cfg = None if switch is None else config.parse(["kv_spec_merge"], environ={"KIMI_HOTFIX": switch})
    monkeypatch.setattr(state, "_config", cfg)
    monkeypatch.setattr(state, "_armed_by", ["plugin", "sitecustomize", "plugin"])
    monkeypatch.setattr(core, "__version__", "9.9.9")
    monkeypatch.setattr(metrics, "_told", core.snapshot())  # what the core tells it
    rec = metrics.record()
    assert rec["pid"] == os.getpid() and rec["role"] == "main"
    assert rec["info"]["version"] == "9.9.9" and rec["info"]["enabled"] == enabled
    assert rec["info"]["armed_by"] == "plugin,sitecustomize"  # each once, in order
    assert sorted(rec["info"]) == sorted(metrics.INFO_LABELS) and scrape._shape(rec) is True


def test_the_process_answering_a_scrape_is_the_api_server(monkeypatch):
    monkeypatch.setattr(metrics, "_pod", None)
    (me,) = scrape._pod_records()
    assert me["role"] == "APIServer" and me["pid"] == os.getpid()
