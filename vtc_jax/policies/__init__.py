"""Scheduling policies as components, and their registry.

`registry.names()` is the one list of policy names; `registry.get(name)` returns a
`Policy` (base.py). The built-in policies are registered here, in this order (the order
also fixes the engine's dispatch order when a batch mixes policies). A user's own policy
is registered from a file with `policy_modules.load_policy_module(path)` (the CLIs'
`--policy-module`). docs/POLICIES.md describes the interface with a worked example.
"""

from vtc_jax.policies import registry
from vtc_jax.policies.base import Admission, Arrivals, Choice, Completion, Costs, EncodeContext, Policy, Shape, StepEnd, View
from vtc_jax.policies.drr import DRR
from vtc_jax.policies.fair_queueing import SFQ, WFQ
from vtc_jax.policies.fcfs import FCFS, RPM
from vtc_jax.policies.gateway import VTC_GATEWAY
from vtc_jax.policies.las import LAS
from vtc_jax.policies.round_robin import RR
from vtc_jax.policies.vtc import LCF, VTC
from vtc_jax.policies.vtc_artifact import VTC_ARTIFACT
from vtc_jax.policies.vtc_predict import VTC_PREDICT

for _policy in (FCFS, LCF, VTC, RPM, DRR, WFQ, SFQ, LAS, VTC_PREDICT, VTC_GATEWAY, VTC_ARTIFACT, RR):
    registry.register(_policy, source="a built-in policy")

names = registry.names
get = registry.get

__all__ = ["Admission", "Arrivals", "Choice", "Completion", "Costs", "EncodeContext", "Policy", "Shape", "StepEnd",
           "View", "registry", "names", "get"]
