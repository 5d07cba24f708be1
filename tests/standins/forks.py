"""Child-side plumbing for the fork-safety tests (imported inside subprocesses;
not a stand-in for vLLM: it drives the shim's own locks).

``LOCKS`` names every lock the shim can hold while another thread forks, and
how to hold it: the shim's own (found in its source by tests/unit/test_fork_safety.py,
which fails when a lock there has no entry here) and those of other code it
takes (wrapt's post-import hook lock, its log handler's lock). ``fork_while_held``
holds one in a thread (with events: the thread says when it holds it and waits
to be let go), forks, and runs ``work()`` in the child under an alarm: a child
that blocks on a lock nobody will release dies of SIGALRM instead of hanging
the test, and reads ``hung``.
"""

import json
import os
import signal
import sys
import threading
import time


def _hold_with(lock_getter):
    def hold(reached, go):
        with lock_getter():
            reached.set()
            go.wait(60)
    return hold


def _wrapt_lock():
    from kimi_hotfix.runtime import _wrapt
    return sys.modules[_wrapt.load().__name__ + ".importer"]._post_import_hooks_lock


class _HandlerLock:
    """The kimi_hotfix log handler's lock (logging.Handler.acquire/release)."""

    def __enter__(self):
        import logging

        (self.handler,) = [h for h in logging.getLogger("kimi_hotfix").handlers
                           if type(h).__name__ == "_StderrHandler"]
        self.handler.acquire()

    def __exit__(self, *exc):
        self.handler.release()


def locks():
    """{lock: hold(reached, go)}."""
    from kimi_hotfix.runtime import parity, state, wrapping
    return {
        "kimi_hotfix.runtime.state._lock": _hold_with(state.lock),
        "kimi_hotfix.runtime.wrapping._install_lock": _hold_with(lambda: wrapping._install_lock),
        "kimi_hotfix.runtime.parity._lock": _hold_with(lambda: parity._lock),
        "wrapt.importer._post_import_hooks_lock": _hold_with(_wrapt_lock),
        "logging.Handler.lock (kimi_hotfix's handler)": _hold_with(_HandlerLock),
    }


def fork_while_held(name, hold, work, timeout=20):
    """Fork while another thread holds ``name`` (``hold(reached, go)`` in a
    thread); the child runs ``work()`` (a dict) and writes it back. Returns
    {"lock", "hung", "exit", "seconds", "child"}."""
    reached, go = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=(reached, go), daemon=True)
    holder.start()
    if not reached.wait(30):
        go.set()
        return {"lock": name, "error": "the lock was never held"}
    read, write = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: bounded by the alarm
        os.close(read)
        signal.alarm(timeout)
        try:
            out = {"ok": True, **work()}
        except BaseException as exc:  # reported, not raised: the parent reads it
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(out, default=repr).encode())
        os.close(write)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    go.set()
    holder.join(60)
    _, status = os.waitpid(pid, 0)
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    hung = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
    return {"lock": name, "hung": hung, "exit": status, "pid": pid,
            "seconds": round(time.monotonic() - started, 3),
            "child": json.loads(b"".join(chunks) or b"null")}


def outcome(call):
    try:
        return ["ok", repr(call())]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
