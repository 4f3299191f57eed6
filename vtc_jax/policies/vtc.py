"""Least counter first (MODEL.md `lcf`) and the Virtual Token Counter (`vtc`): the head of
the backlogged client with the smallest MODEL.md counter c_k (ties: smallest k); `vtc`
also lifts a returning client's counter on arrival (MODEL.md's lift rule, with or without
the `last_left` clause: Settings.lift_last_left). Weighted VTC is `vtc` with weights: the
counter already holds charges / weight."""

from __future__ import annotations

import dataclasses

import numpy as np

from vtc_jax.policies.base import Policy, argmin_choice, lift, no_state


def encode(settings, ctx) -> dict:
    return {"last_left": np.bool_(True if settings is None else settings.lift_last_left)}


def select(state, view, eligible, params):
    return argmin_choice(view.counter, eligible, state, view.num)


def on_arrival(state, view, arrivals, params):
    counter = lift(view.counter, view.backlogged, arrivals.newcomer, arrivals.first, view.last_left,
                   params["last_left"], view.num)
    return state, counter


class ReferenceLCF:
    """Literal LCF: the eligible client with the smallest c_k, ties smallest k."""

    lifts = False

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim

    def select(self, eligible):
        best = None
        for k in eligible:  # ascending k: strict < keeps the smallest k on ties
            if best is None or self.sim.c[k] < self.sim.c[best]:
                best = k
        return best

    def on_arrival(self, n):
        """MODEL.md phase 1: lift a client that is not backlogged, just before it joins."""
        sim = self.sim
        k = sim.reqs[n].client
        if not self.lifts or sim.fifo[k]:
            return
        backlogged = [i for i in range(sim.K) if sim.fifo[i]]
        if backlogged:
            sim.c[k] = max(sim.c[k], min(sim.c[i] for i in backlogged))
        elif self.settings.lift_last_left and sim.last_left is not None:
            sim.c[k] = max(sim.c[k], sim.c[sim.last_left])


class ReferenceVTC(ReferenceLCF):
    lifts = True


LCF = Policy(name="lcf", summary="least counter first: the backlogged client with the smallest counter, no lift",
             encode=encode, init=no_state, select=select, reference=ReferenceLCF, reads=("weights",), quiet=True)
VTC = dataclasses.replace(LCF, name="vtc", summary="Virtual Token Counter: least counter first with the lift rule",
                          on_arrival=on_arrival, reference=ReferenceVTC, reads=("weights", "lift_last_left"))
