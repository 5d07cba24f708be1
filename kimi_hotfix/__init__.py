"""kimi-hotfix: runtime hotfixes for Kimi-K3 on vLLM 0.29-era containers.

Importing this package is cheap and imports neither vLLM nor wrapt. The public
API loads the machinery on first use:

    arm()          register the post-import hooks (idempotent)
    undo(name)     restore vLLM's original methods (all patches when name is None)
    reapply(name)  decide and apply again after undo
    states()       {patch name: State} (``State.kind`` and ``str(state)``)
"""

__version__ = "0.1.0"
__all__ = ["arm", "undo", "reapply", "states", "__version__"]


def arm(source="api"):
    from kimi_hotfix import core

    return core.arm(source)


def undo(name=None):
    from kimi_hotfix import core

    return core.undo(name)


def reapply(name=None):
    from kimi_hotfix import core

    return core.reapply(name)


def states():
    from kimi_hotfix import core

    return core.states()
