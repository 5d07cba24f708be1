"""kimi-hotfix: runtime hotfixes for Kimi-K3 on vLLM 0.29-era containers.

Importing this package is cheap and imports neither vLLM nor wrapt. The public
API loads the machinery on first use:

    arm()          register the post-import hooks (idempotent)
    undo(name)     restore vLLM's original methods (all patches when name is None);
                   a patch still pending stays off; the states name what could
                   not be restored
    reapply(name)  decide and apply again after undo
    states()       {patch name: State} (``State.kind`` and ``str(state)``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from kimi_hotfix.runtime.base import State

__all__ = ["arm", "undo", "reapply", "states", "__version__"]


def arm(source: str = "api") -> dict[str, State]:
    from kimi_hotfix.runtime import core
    return core.arm(source)


def undo(name: Optional[str] = None) -> dict[str, State]:
    from kimi_hotfix.runtime import core
    return core.undo(name)


def reapply(name: Optional[str] = None) -> dict[str, State]:
    from kimi_hotfix.runtime import core
    return core.reapply(name)


def states() -> dict[str, State]:
    from kimi_hotfix.runtime import core
    return core.states()


def __getattr__(name: str):
    """``__version__`` (versions.SHIM) when asked: importing the package imports
    nothing, so ``status`` names a broken module instead of failing first."""
    if name == "__version__":
        from kimi_hotfix.runtime.versions import SHIM

        return SHIM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
