"""Slow, literal reference simulators that the fast engine and its tests are checked against,
and the random lanes that fuzz it: `check_policy(name)` checks a registered policy (a user's
own too) against the literal model in one call, as the tests do. Nothing in the package
imports this floor, and it needs neither pytest nor hypothesis."""

from vtc_jax.testing.lanes import check_policy

__all__ = ["check_policy"]
