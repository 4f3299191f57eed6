"""First come, first served (MODEL.md `fcfs`), and `rpm`: FCFS with a required RPM limit
(MODEL.md's rpm policy; the limit itself is an admission limit that composes with any
policy, see settings.Settings.rpm_limit)."""

from __future__ import annotations

import dataclasses

from vtc_jax.core import wide
from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import ORDER
from vtc_jax.policies.base import Choice, Policy, argmin_choice, no_params, no_state


def select(state, view, eligible, params) -> Choice:
    """The oldest eligible FIFO head: smallest (arrival, number), i.e. smallest ORDER (or,
    on a server that requeues at its tail, the head first in its one waiting order)."""
    if view.order is not None:
        return argmin_choice(view.order, eligible, state, num=wide.WIDE)
    return argmin_choice(view.heads[:, ORDER], eligible, state)


class Reference:
    """Literal FCFS: the eligible head with the smallest (arrival, request number)."""

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim

    def select(self, eligible):
        sim = self.sim
        heads = [(sim.reqs[sim.fifo[k][0]].arrival, sim.fifo[k][0], k) for k in eligible]
        return min(heads)[2] if heads else None


def _needs_limit(settings) -> None:
    if settings.rpm_limit is None:
        raise InputError("policy rpm needs an rpm limit (--rpm R)")


FCFS = Policy(name="fcfs", summary="first come, first served: the oldest waiting request",
              encode=no_params, init=no_state, select=select, reference=Reference, quiet=True)
RPM = dataclasses.replace(FCFS, name="rpm", summary="FCFS with a per-client requests-per-window limit (--rpm R)",
                          reads=("rpm_limit",), validate=_needs_limit)
