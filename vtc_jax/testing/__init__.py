"""Slow, literal reference simulators that the fast engine and its tests are checked against."""
