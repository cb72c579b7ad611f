"""`python -m transformer_jax.cli ...` is `transformer-jax ...`."""

import sys

from transformer_jax.cli import main

sys.exit(main())
