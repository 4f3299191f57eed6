import sys

from vtc_jax.cli.commands import main

sys.exit(main())
