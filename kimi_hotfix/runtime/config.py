"""The environment contract, parsed once per process when vLLM is imported.

KIMI_HOTFIX           1/on/true/yes (default) or 0/off/false/no: master switch
KIMI_HOTFIX_DISABLE   comma-separated patch names to skip; ``*`` skips all
KIMI_HOTFIX_FORCE     comma-separated patch names to apply even where vLLM looks fixed
KIMI_HOTFIX_STRICT    1: a patch that should apply but cannot raises at import
KIMI_HOTFIX_LOG_LEVEL level of the ``kimi_hotfix`` logger (default INFO)
KIMI_HOTFIX_LOG_FORMAT text (default) or json: one JSON object per line
KIMI_HOTFIX_POD_FILES 1 (default) or 0: 0 writes no file for /metrics' pod view
                      (docs/security.md); an unknown value is off (it writes nothing)

Values: case and surrounding spaces are ignored; unset and empty are the same.
Nothing here raises: a value that cannot be parsed yields one warning that lists
the valid values, and the default is kept, except for the master switch, which
fails closed: an unknown ``KIMI_HOTFIX`` value (``disabled``, ``O``, ``flase``)
turns the shim off. The switch is on by default, so whoever sets it is reaching
for the kill switch, most likely during an incident; a typo that left the shim
patching every process while the operator believes it is out is the failure
nobody sees. Off is loud instead: the warning, every patch ``disabled
(KIMI_HOTFIX=<value>)`` in the summary line, ``status`` exits 3, ``check``
fails where a patch is needed. Warnings are (message, args) pairs of the
catalog in kimi_hotfix.runtime.messages; ``Config.warning_texts`` renders them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kimi_hotfix.runtime import messages

TRUE = ("1", "on", "true", "yes")
FALSE = ("0", "off", "false", "no")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    disabled: frozenset = frozenset()
    forced: frozenset = frozenset()
    strict: bool = False
    log_level: str = "INFO"
    log_format: str = "text"
    pod_files: bool = True
    warnings: tuple = field(default=())
    raw: tuple = ()  # (name, value) pairs of the variables that were set

    @property
    def warning_texts(self) -> tuple:
        return tuple(message.text % args for message, args in self.warnings)


SHOWN = 60  # characters of a bad value quoted in a warning


def _shown(value):
    """repr of a bad value, cut to SHOWN characters: a warning stays one line."""
    if len(value) <= SHOWN:
        return repr(value)
    return f"{value[:SHOWN]!r}... ({len(value)} characters)"


def _flag(name, value, default, warnings, unknown=None):
    """A boolean toggle: ``default`` when unset or empty; ``unknown`` (default:
    ``default``) with a warning when the value is neither true nor false."""
    if value is None:
        return default
    text = value.strip().lower()
    if text == "":
        return default
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    chosen = default if unknown is None else unknown
    using = "on" if chosen else "off"
    if chosen != default:
        using += f" (an unknown {name} fails closed)"
    warnings.append((messages.CONFIG_FLAG, (name, _shown(value), "/".join(TRUE), "/".join(FALSE),
                                            using)))
    return chosen


def _names(name, value, valid, warnings):
    if not value:
        return frozenset()
    chosen, unknown = set(), []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        if item == "*":
            chosen.update(valid)
        elif item in valid:
            chosen.add(item)
        else:
            unknown.append(item)
    if unknown:  # one warning per variable, however many bad names
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        warnings.append((messages.CONFIG_NAMES, (
            name, "s" if len(unknown) > 1 else "", ", ".join(_shown(item) for item in unknown[:3]),
            more, ", ".join(valid))))
    return frozenset(chosen)


def parse(valid_names, environ=None, switches=()) -> Config:
    """``valid_names``: the patches; ``switches``: what else KIMI_HOTFIX_DISABLE
    (not FORCE) may name (-O parity, kimi_hotfix.runtime.parity)."""
    env = os.environ if environ is None else environ
    warnings: list = []
    valid = tuple(valid_names)
    # the master switch fails closed (see the docstring): an unknown value is off
    enabled = _flag("KIMI_HOTFIX", env.get("KIMI_HOTFIX"), True, warnings, unknown=False)
    disabled = _names("KIMI_HOTFIX_DISABLE", env.get("KIMI_HOTFIX_DISABLE"),
                      (*switches, *valid), warnings)
    forced = _names("KIMI_HOTFIX_FORCE", env.get("KIMI_HOTFIX_FORCE"), valid, warnings)
    both = sorted(disabled & forced)
    if both:
        warnings.append((messages.CONFIG_BOTH, (", ".join(both),)))
        forced = forced - disabled
    strict = _flag("KIMI_HOTFIX_STRICT", env.get("KIMI_HOTFIX_STRICT"), False, warnings)
    level = (env.get("KIMI_HOTFIX_LOG_LEVEL") or "").strip().upper() or "INFO"  # blank = unset
    if level not in LEVELS:
        warnings.append((messages.CONFIG_LEVEL, ("KIMI_HOTFIX_LOG_LEVEL",
                                                 _shown(env.get("KIMI_HOTFIX_LOG_LEVEL")),
                                                 ", ".join(LEVELS), "INFO")))
        level = "INFO"
    log_format = (env.get("KIMI_HOTFIX_LOG_FORMAT") or "").strip().lower() or "text"
    if log_format not in FORMATS:
        warnings.append((messages.CONFIG_LEVEL, ("KIMI_HOTFIX_LOG_FORMAT",
                                                 _shown(env.get("KIMI_HOTFIX_LOG_FORMAT")),
                                                 ", ".join(FORMATS), "text")))
        log_format = "text"
    pod_files = _flag("KIMI_HOTFIX_POD_FILES", env.get("KIMI_HOTFIX_POD_FILES"), True, warnings,
                      unknown=False)
    raw = tuple(
        (k, env[k])
        for k in (
            "KIMI_HOTFIX",
            "KIMI_HOTFIX_DISABLE",
            "KIMI_HOTFIX_FORCE",
            "KIMI_HOTFIX_STRICT",
            "KIMI_HOTFIX_LOG_LEVEL",
            "KIMI_HOTFIX_LOG_FORMAT",
            "KIMI_HOTFIX_POD_FILES",
        )
        if k in env
    )
    return Config(enabled, disabled, forced, strict, level, log_format, pod_files,
                  tuple(warnings), raw)


def printable(value: str) -> str:
    """``value`` as one safe piece of a log line: control characters (a newline
    would start a forged line), ``|`` (the summary line's separator) and
    backslashes escaped, cut to SHOWN characters."""
    if len(value) > SHOWN:
        value = f"{value[:SHOWN]}... ({len(value)} characters)"
    return "".join(c if c.isprintable() and c not in "|\\" else
                   (f"\\x{ord(c):02x}" if ord(c) < 256 else c.encode("unicode_escape").decode())
                   for c in value)
