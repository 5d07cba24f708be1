"""Stand-in (shim mechanics only, NOT vLLM): the group getter renamed away."""


def get_inner_data_parallel_group():
    return None


HOST_VALUE = "parallel_state works"
