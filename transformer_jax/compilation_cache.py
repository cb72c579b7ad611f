"""JAX's persistent compilation cache in the user's cache directory: a second run of a config skips XLA compiles.

The directory is, in order: the `directory` argument (the CLI's --compilation-cache), the environment variable
TRANSFORMER_JAX_COMPILATION_CACHE, or $XDG_CACHE_HOME/transformer_jax/xla (~/.cache/... by default).
'off' (or 0 / none / false) disables it. The cache is keyed by the computation, jax/jaxlib version and
device, so a stale entry is never used; deleting the directory is always safe.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

ENV_VAR = "TRANSFORMER_JAX_COMPILATION_CACHE"
OFF = ("off", "0", "none", "false", "no")
logger = logging.getLogger(__name__)


def default_directory() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer_jax" / "xla"


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Turns the cache on (returns its directory) unless the setting is 'off' or the directory is not writable."""
    setting = str(directory) if directory is not None else os.environ.get(ENV_VAR, "")
    if setting.strip().lower() in OFF:
        return None
    path = Path(setting).expanduser() if setting else default_directory()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        logger.warning(
            "compilation cache off: cannot create %s (%s); set %s to a writable directory or 'off'.",
            path,
            error.strerror,
            ENV_VAR,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)  # skip trivial compiles
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
