"""A server of your own, outside the package: MODEL.md's server with one seat.

At most MAX_RUNNING requests run at once (like vLLM's `max_num_seqs`); otherwise it is
the `ideal` server exactly: memory M bounds admission, each step decodes one token of every
running request. The file holds everything a server is (docs/SERVERS.md): its functions,
bundled as a `Server`. It reuses the ideal server's state and functions and changes one
rule, `fits`.

    from vtc_jax import Settings, Trace, replay
    from vtc_jax.servers import registry
    import examples.my_server as mine

    registry.register(mine.SERVER)
    trace = Trace.from_rows([(0, 0, 10, 3), (0, 0, 10, 2)])
    replay(trace, Settings(policy="fcfs", kv_budget=1000), steps=3, server="one_seat").completed
    # [[1]]: the seat is taken for steps 0-2 (the ideal server completes both)
"""

import dataclasses

from vtc_jax.servers import ideal

MAX_RUNNING = 1


def fits(state, params, row, *, generated=None):
    """The ideal server's memory rule, and a free seat."""
    return ideal.fits(state, params, row, generated=generated) & (state.running.sum() < MAX_RUNNING)


SERVER = dataclasses.replace(ideal.IDEAL, name="one_seat", description="the ideal server, one request at a time",
                             fits=fits)
