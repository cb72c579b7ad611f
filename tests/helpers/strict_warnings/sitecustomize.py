"""Imported at start-up by every Python the tests start (tests/conftest.py puts this folder on PYTHONPATH): a
deprecation raised from jax, flax, optax, orbax or this project's code is an error there too, as pyproject.toml's
`filterwarnings` makes it in the tests themselves. Other packages' deprecations are theirs to fix, not ours."""

import warnings

OURS_AND_JAX = r"(jax|jaxlib|flax|optax|orbax|chex|transformer_jax|__main__)(\.|$)"
for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
    warnings.filterwarnings("error", category=category, module=OURS_AND_JAX)
# As in pyproject.toml: orbax-checkpoint <= 0.12.8 annotates with a class jax 0.12.1 deprecates.
warnings.filterwarnings(
    "ignore", r"jax\.sharding\.SingleDeviceSharding is deprecated", DeprecationWarning, r"orbax(\.|$)"
)
