import sys

from vtc_jax.cli import main

sys.exit(main())
