"""The hostile-host tier's driver (tests/real/test_hostile.py), one per pid namespace.

    python -O hostile_child.py CONFIG.json

Run by the real vLLM 0.29.0 venv's python, as pid 2 of a pid namespace of its
own (``unshare --pid --fork --mount-proc``, a shell as pid 1, as a container's
entrypoint), with the shim on PYTHONPATH. It imports torch once, then forks one
child per case of CONFIG's "cases", each a vLLM process of the exporter: the
case's environment is set, vLLM's KV-cache interface and prometheus_client are
imported (the shim arms: the pod directory, or the multiprocess gauges), the
case does what it says, and the exporter is scraped. The two drivers of a test
(namespaces "a" and "b") take turns through files in CONFIG's "control"
directory. Each child writes ``<case>.json`` there: what it saw. No ``assert``:
this may run under -O.
"""

import json
import os
import signal
import subprocess
import sys
import time
import traceback

CONFIG = json.loads(open(sys.argv[1]).read())
CONTROL = CONFIG["control"]
TIMEOUT = 180


def mark(name):
    with open(os.path.join(CONTROL, name), "w") as f:
        f.write(str(os.getpid()))


def wait(name):
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(os.path.join(CONTROL, name)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name} from the other namespace")
        time.sleep(0.05)


def scrape(multiprocess):
    import prometheus_client as pc

    if multiprocess:
        from prometheus_client import multiprocess as mp

        registry = pc.CollectorRegistry()
        mp.MultiProcessCollector(registry)
        return pc.generate_latest(registry).decode()
    return pc.generate_latest(pc.REGISTRY).decode()


def series_pids(text):
    """pid labels of the kimi_hotfix_info series at 1."""
    import re

    return sorted({m.group(1) for m in re.finditer(r'^kimi_hotfix_info\{[^}]*pid="([^"]*)"[^}]*\} 1\.0$',
                                                   text, re.M)})


def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return f"{type(exc).__name__}"


def arm(case):
    os.environ.update(case.get("env", {}))
    for name in case.get("unset", []):
        os.environ.pop(name, None)
    import prometheus_client  # noqa: F401  (its hook: the collector, or this process's gauges)
    import vllm.v1.kv_cache_interface  # noqa: F401  (the shim arms: pod directory or gauges)

    return os.environ.get("KIMI_HOTFIX_POD_DIR")


PAYLOAD = ('assert __import__("os").environ.setdefault("KIMI_PWNED", "1"), '
           '"inner dp world group is not initialized"')
ORIGINAL = 'assert _INNER_DP_WORLD is not None, "inner dp world group is not initialized"'


def changed_source(case):
    """vLLM's parallel_state.py (a real copy in an overlay of the installed vLLM)
    changed after the import, as an in-place upgrade or a writable site-packages
    would: once before the shim armed (vLLM's plugin loader arms it late, the
    bootstrap's trigger taken away), and once more, with the shim armed, before
    the hardened getter's first call."""
    sys.path.insert(0, case["overlay"])
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "VllmImportTrigger"]
    import vllm.distributed.parallel_state as ps

    path = ps.__file__
    out = {"pid": os.getpid(), "name": case["name"], "file": path}
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace(ORIGINAL, PAYLOAD))
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from kimi_hotfix.runtime import core
    out["late_state"] = str(core.parity_state())
    try:
        out["late_call"] = repr(ps.get_inner_dp_world_group())
    except AssertionError as exc:
        out["late_call"] = f"AssertionError: {exc}"
    out["pwned"] = os.environ.get("KIMI_PWNED")  # the changed assert ran
    return out


def run_case(case):
    if case.get("overlay"):
        return changed_source(case)
    out = {"pid": os.getpid(), "name": case["name"]}
    multiprocess = bool(case.get("env", {}).get("PROMETHEUS_MULTIPROC_DIR"))
    pod = arm(case)
    out["pod"] = pod
    out["pod_mode"] = oct(os.stat(pod).st_mode & 0o777) if pod and os.path.isdir(pod) else None
    out["armed_scrape"] = series_pids(scrape(multiprocess))
    def fill(text):  # this namespace, and the start times of its pids 1 (sh) and 2 (driver)
        return text.replace("{ns}", ns()).replace("{start1}", start(1)).replace("{start2}", start(2))

    for record, data in case.get("plant_records", {}).items():  # into its own pod directory
        with open(os.path.join(pod, fill(record)), "w") as f:
            f.write(data)
    if case.get("signal"):
        mark(case["signal"])
    if case.get("then_wait"):
        wait(case["then_wait"])
    if case.get("clean_and_plant"):  # a /tmp cleaner removes the pod directory; another
        # user makes it again first and plants a link where a record goes
        import shutil

        shutil.rmtree(pod)
        link = os.path.join(pod, f"{os.getpid()}-{start('self')}-{ns()}.json")
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                        f'mkdir -m 777 "{pod}" && ln -s "{case["clean_and_plant"]}" "{link}"'],
                       check=True)
        from kimi_hotfix.runtime import core
        core.undo("kv_spec_merge")  # a change of the states: the exporter writes again
        core.reapply("kv_spec_merge")
    text = scrape(multiprocess)
    out["scrape"] = series_pids(text)
    out["scrape_text"] = "\n".join(line for line in text.splitlines() if line.startswith("kimi_hotfix_info"))
    out["pod_listing"] = listing(pod) if pod else None
    out["pod_mode_after"] = (oct(os.stat(pod).st_mode & 0o777) if pod and os.path.isdir(pod)
                             else None)
    if multiprocess:
        out["multiproc_listing"] = listing(case["env"]["PROMETHEUS_MULTIPROC_DIR"])
    return out


def ns():
    return os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]")


def start(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[19].decode()


def main():
    import torch  # noqa: F401  (what no case changes: loaded once, forked)

    report = {"driver": os.getpid(), "ns": ns(), "cases": {}}
    for case in CONFIG["cases"]:
        if case.get("wait"):
            wait(case["wait"])
        base = os.path.join(CONTROL, case["name"])
        pid = os.fork()
        if pid == 0:
            signal.alarm(TIMEOUT)
            for path, fd in ((base + ".out", 1), (base + ".err", 2)):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(target, fd)
                os.close(target)
            try:
                out = run_case(case)
            except BaseException:
                out = {"error": traceback.format_exc()}
            with open(base + ".json", "w") as f:
                json.dump(out, f)
            import atexit

            atexit._run_exitfuncs()  # as at a process's exit: the shim's own clean-up runs
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # not back into this loop
        if case.get("background"):
            report["cases"][case["name"]] = {"child": pid}
            continue
        _, status = os.waitpid(pid, 0)
        report["cases"][case["name"]] = {"child": pid, "status": status}
    for info in report["cases"].values():  # the background ones
        if "status" not in info:
            info["status"] = os.waitpid(info["child"], 0)[1]
    mark(f"{CONFIG['namespace']}-driver-done")
    with open(os.path.join(CONTROL, f"driver-{CONFIG['namespace']}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
