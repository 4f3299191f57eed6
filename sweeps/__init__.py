"""Sweep CLIs: `python -m sweeps.NAME --seeds N --out DIR` (see vtc_jax/driver/sweep.py)."""
