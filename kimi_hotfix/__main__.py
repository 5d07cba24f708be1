"""``python -m kimi_hotfix status|check [--json]``: see kimi_hotfix.tools.cli.

Also runs as ``python /path/to/shim/kimi_hotfix status``, which works under
``-I``/``-E`` too, where PYTHONPATH (and so ``-m``) cannot find the package.

Where the shim's own files are so broken that the command line itself cannot
load (or ``status`` cannot run), this prints what it can, names the cause and
exits 1, never a traceback: ``status`` is what an operator runs to find out
why the shim is not working. Stdlib only below, for that reason.
"""

import os
import sys

if not __package__:  # run as a directory: make the package importable
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path.insert(0, os.path.dirname(here))

BROKEN = 1  # the exit status of ``status`` where the shim's own files cannot load


def _cause(exc) -> str:
    """``Type: message`` and where: a SyntaxError's file, else the last frame.
    A copy of ``kimi_hotfix.runtime.base.describe`` on purpose: base may be the file
    that cannot load."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = f"{type(exc).__name__}: {exc}"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and not isinstance(exc, ImportError):
        where = tb.tb_frame.f_code.co_filename
        if where not in text and not where.startswith("<"):
            text += f" (at {where}, line {tb.tb_lineno})"
    return text


def _broken(exc, argv) -> int:
    """The report of a shim whose command line cannot run."""
    import json

    package = os.path.dirname(os.path.abspath(__file__))
    cause = _cause(exc)
    active = (f"BROKEN: the shim's own files cannot load ({cause}); vLLM runs unpatched "
              "wherever the shim needs them; reinstall or remount the shim")
    command = next((a for a in argv if not a.startswith("-")), "status")
    if "--json" in argv:
        print(json.dumps({"kimi_hotfix": {"path": package}, "active": active,
                          "broken": [{"module": "kimi_hotfix", "error": cause}],
                          "patches": [], "exit_status": BROKEN}, indent=1))
    else:
        print(f"kimi-hotfix {command} ({package})\n  active     {active}\n"
              f"  python     {sys.version.split()[0]} {sys.executable}, "
              f"optimize {sys.flags.optimize}\n"
              "  patches    none can be listed: the shim's own files cannot load (above)")
    return BROKEN


def _main() -> int:
    argv = sys.argv[1:]
    try:
        from kimi_hotfix.tools.cli import main
    except Exception as exc:
        return _broken(exc, argv)
    if next((a for a in argv if not a.startswith("-")), None) != "status":
        return main()
    try:
        return main()
    except Exception as exc:  # status must report, not crash
        return _broken(exc, argv)


if __name__ == "__main__":
    sys.exit(_main())
