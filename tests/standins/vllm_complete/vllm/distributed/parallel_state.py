"""Stand-in (shim mechanics only, NOT vLLM): a group getter that guards with assert."""

_INNER_DP_WORLD = None


def get_inner_dp_world_group():
    assert _INNER_DP_WORLD is not None, "inner dp world group is not initialized"
    return _INNER_DP_WORLD
