"""Sweep CLIs: `python -m sweeps.NAME --seeds N --out DIR` (see vtc_jax/cli/sweep_command.py and vtc_jax/driver/sweep.py)."""
