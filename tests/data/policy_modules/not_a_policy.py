"""POLICY is not a Policy."""

POLICY = 42
