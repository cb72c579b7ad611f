"""Multi-host start-up (docs/SCALING.md); each process's share of the global batch is in sharding.py.

    info = distributed.initialize(experiment.distributed)   # FIRST, before any other JAX call
    mesh = sharding.make_mesh(experiment.mesh.shape)      # over jax.devices(): every process's devices
    shard_index, shard_count = sharding.data_shard(mesh, rules)   # -> TrainBatches(shard_index=, shard_count=)
    batch = sharding.global_batch(local_batch, mesh, rules)      # process-local rows -> global jax.Arrays
    rows = sharding.local_rows(eval_batch, shard_index, shard_count)  # own rows of a batch all processes hold

Settings come from the config's `distributed` section (experiment.DistributedConfig), then from
the environment, then from JAX's cluster auto-detection (Cloud TPU pods, SLURM, Open MPI, ...):

    coordinator_address   'host:port' of process 0          env TJ_COORDINATOR_ADDRESS or JAX_COORDINATOR_ADDRESS
    num_processes         how many processes in all         env TJ_NUM_PROCESSES
    process_id            this process, 0 .. num_processes-1   env TJ_PROCESS_ID
    local_device_ids      devices of this process (GPU)     env JAX_LOCAL_DEVICE_IDS (read by JAX)
    initialization_timeout  seconds to wait for all processes (default 300)

With nothing set and no cluster detected, `initialize` does nothing (one process). A launch that cannot complete
(coordinator unreachable, a process missing, processes disagreeing on the process count) raises
`DistributedStartupError` within about `initialization_timeout` seconds, saying what to check, instead of hanging
(exit STARTUP_FAILED_EXIT_CODE). After start-up, peers.py watches the other processes (a lost one ends the run with
one line) and leaves the run in order at exit; a signal to one process stops them all (train/actions.StopSignals).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax

from transformer_jax import peers
from transformer_jax.errors import UserError
from transformer_jax.experiment import DistributedConfig

logger = logging.getLogger(__name__)

ENV_COORDINATOR = ("TJ_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
ENV_NUM_PROCESSES = ("TJ_NUM_PROCESSES",)
ENV_PROCESS_ID = ("TJ_PROCESS_ID",)
# Environment variables by which a launcher tells each process that it is one of several.
CLUSTER_HINTS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class DistributedStartupError(UserError, RuntimeError):
    """The processes of a multi-host run could not find each other; the message says what to check."""


class ProcessInfo(NamedTuple):
    process_index: int
    process_count: int
    local_device_count: int
    device_count: int
    initialized: bool  # True when jax.distributed was initialized (several processes)


def _env(names: Sequence[str]) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


def _as_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedStartupError(f"{what}={value!r} is not an integer.") from None


def resolve_config(section: DistributedConfig | None = None) -> DistributedConfig:
    """The `distributed` section completed from the environment, validated (raises DistributedStartupError)."""
    section = section or DistributedConfig()
    env_ids = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    local_ids = section.local_device_ids or (env_ids.split(",") if env_ids else None)
    cfg = section.replace(
        coordinator_address=section.coordinator_address or _env(ENV_COORDINATOR),
        num_processes=_as_int(_first(section.num_processes, _env(ENV_NUM_PROCESSES)), "num_processes"),
        process_id=_as_int(_first(section.process_id, _env(ENV_PROCESS_ID)), "process_id"),
        local_device_ids=None if local_ids is None else tuple(int(i) for i in local_ids),
    )
    address = cfg.coordinator_address
    if address is not None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise DistributedStartupError(
                f"coordinator_address={address!r} is not 'host:port' (e.g. '10.0.0.1:1234'): the address of "
                f"process 0, with a port free on that host, the same for every process."
            )
    if cfg.num_processes is not None and cfg.num_processes < 1:
        raise DistributedStartupError(f"num_processes={cfg.num_processes} must be at least 1.")
    if cfg.process_id is not None and cfg.num_processes is not None and not 0 <= cfg.process_id < cfg.num_processes:
        raise DistributedStartupError(
            f"process_id={cfg.process_id} must lie in [0, num_processes={cfg.num_processes}); give each process "
            f"a distinct id 0 .. {cfg.num_processes - 1}."
        )
    if cfg.initialization_timeout <= 0:
        raise DistributedStartupError(f"initialization_timeout={cfg.initialization_timeout} must be positive.")
    if cfg.cpu_collectives not in (None, "gloo", "mpi"):
        raise DistributedStartupError(f"cpu_collectives={cfg.cpu_collectives!r}: use 'gloo' or 'mpi'.")
    return cfg


def _wanted(cfg: DistributedConfig) -> bool:
    if cfg.enabled is not None:
        return bool(cfg.enabled)
    if cfg.num_processes == 1:
        return False
    if cfg.coordinator_address or cfg.num_processes or cfg.cluster_detection_method:
        return True
    return any(int(os.environ.get(name, "1") or 1) > 1 for name in CLUSTER_HINTS)


def _info(initialized: bool) -> ProcessInfo:
    return ProcessInfo(
        jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(), initialized
    )


def _describe(cfg: DistributedConfig) -> str:
    return (
        f"process_id={cfg.process_id}, num_processes={cfg.num_processes}, coordinator_address="
        f"{cfg.coordinator_address!r}, initialization_timeout={cfg.initialization_timeout}s"
    )


# JAX's own connection deadline is set this much later than initialization_timeout, so that a failed start-up
# ends with this module's message (the watchdog) rather than the runtime's abort.
_JAX_DEADLINE_GRACE_S = 15
STARTUP_FAILED_EXIT_CODE = 3
# Where each process posts the num_processes it was launched with, for _check_agreement.
_AGREEMENT_KEY = "transformer_jax/launched_num_processes"
_HINTS = (
    "Check that: process 0 is running and reachable at coordinator_address from every host (the same "
    "address for all processes, its port free on process 0's host and open in the firewall); all "
    "num_processes processes were started, each with a distinct process_id in [0, num_processes) and the "
    "same num_processes; no proxy variables (http_proxy, ...) redirect the connection."
)


class _Watchdog:
    """Ends the process with a clear message if start-up is not done within the timeout.

    The JAX runtime reports a failed rendezvous by aborting the process from C++ (DEADLINE_EXCEEDED on
    RegisterTask, after its own deadline) and a shutdown after a failure can wait for peers that never come; neither
    can be caught in Python, so a timer says what went wrong first and exits with STARTUP_FAILED_EXIT_CODE.
    """

    def __init__(self, seconds: float, message: str):

        self.message = message
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):

        text = f"DistributedStartupError: {self.message}"
        print(text, file=sys.stderr, flush=True)
        os._exit(STARTUP_FAILED_EXIT_CODE)

    def cancel(self):
        self._timer.cancel()


def _preflight(cfg: DistributedConfig) -> None:
    """Cheap socket checks with clear errors, before the JAX runtime starts (nothing to clean up yet)."""
    import socket

    if not cfg.coordinator_address or cfg.process_id is None:
        return  # left to cluster auto-detection
    host, _, port_text = cfg.coordinator_address.rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    if cfg.process_id == 0:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the coordinator's server does
        try:
            probe.bind(("", port))
        except OSError as error:
            raise DistributedStartupError(
                f"process 0 must serve the coordinator on port {port}, but it cannot bind it ({error}): another "
                f"program (or an earlier run) holds it. Choose a free port for coordinator_address "
                f"({cfg.coordinator_address!r})."
            ) from None
        finally:
            probe.close()
        return
    deadline = time.monotonic() + cfg.initialization_timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise DistributedStartupError(
                    f"process {cfg.process_id} could not reach the coordinator at {cfg.coordinator_address!r} "
                    f"within initialization_timeout={cfg.initialization_timeout}s ({error}). Is process 0 "
                    f"running, on that host, with the same coordinator_address? " + _HINTS
                ) from None
            time.sleep(0.25)


def initialize(section: DistributedConfig | None = None) -> ProcessInfo:
    """Joins the multi-process run described by `section` / the environment; call before any other JAX use.

    Returns this process's index and count. Safe to call twice (the second call only reports). A start-up that
    cannot complete raises DistributedStartupError, or -- when the JAX runtime is already waiting -- prints the
    same kind of message and exits with STARTUP_FAILED_EXIT_CODE, within about initialization_timeout seconds.
    """
    if jax.distributed.is_initialized():
        return _info(True)
    cfg = resolve_config(section)
    if not _wanted(cfg):
        return _info(False)
    if cfg.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
    # The coordination service would abort every process from C++ once one misses its heartbeats ("Terminating
    # process because the JAX distributed service detected fatal errors"): with recoverable tasks it does not, and
    # PeerWatch is the one that notices and says so.
    jax.config.update("jax_enable_recoverability", True)
    logger.info("joining the distributed run: %s", _describe(cfg))
    _preflight(cfg)
    watchdog = _Watchdog(
        cfg.initialization_timeout,
        f"the distributed start-up did not complete within initialization_timeout="
        f"{cfg.initialization_timeout}s ({_describe(cfg)}): some of the num_processes processes "
        f"did not join, or were launched with another num_processes than this one's {cfg.num_processes}. " + _HINTS,
    )
    try:
        try:
            jax.distributed.initialize(
                coordinator_address=cfg.coordinator_address,
                num_processes=cfg.num_processes,
                process_id=cfg.process_id,
                local_device_ids=None if cfg.local_device_ids is None else list(cfg.local_device_ids),
                cluster_detection_method=cfg.cluster_detection_method,
                initialization_timeout=cfg.initialization_timeout + _JAX_DEADLINE_GRACE_S,
                heartbeat_timeout_seconds=cfg.heartbeat_timeout,
            )
        except Exception as error:  # XlaRuntimeError (UNAVAILABLE, ...), ValueError from auto-detection
            watchdog.message = f"could not join the distributed run ({_describe(cfg)}): {error}. " + _HINTS
            _shutdown_quietly(cfg)
            raise DistributedStartupError(watchdog.message) from error
        problem = _check_agreement(cfg)
        if problem:
            watchdog.message = problem
            _shutdown_quietly(cfg)
            raise DistributedStartupError(problem)
    finally:
        watchdog.cancel()
    peers.PeerWatch.start(cfg.heartbeat_timeout)
    atexit.register(peers.shutdown)  # before jax's own clean-up (registered at import), which stops the runtime
    info = _info(True)
    logger.info("process %d of %d: %d local devices of %d", *info[:4])
    if jax.default_backend() == "cpu":
        # With jax 0.12.1 a CPU executable with cross-process collectives, written to the persistent cache by
        # process 0 and read back by a restarted run, hangs in its first all-gather: such runs compile afresh.
        jax.config.update("jax_enable_compilation_cache", False)
    return info


def _check_agreement(cfg: DistributedConfig) -> str | None:
    """Every process must agree with the others on the process count: JAX takes the coordinator's count, so a
    process launched with another one would join and then wait for peers that never come. Each process posts its
    launch's count in the coordination service's key-value store and reads every other process's (under the
    start-up watchdog: a process that never posts ends the others with the watchdog's message), then compares.
    Not a device collective: one left unfinished by a peer that gave up keeps a gloo thread waiting, and the CPU
    client's teardown at exit waits for it forever. Returns the problem, or None."""
    # The coordination service's client, as jax's own array_serialization and orbax reach it.
    client = peers.coordination_client()
    me = jax.process_index()
    client.key_value_set(f"{_AGREEMENT_KEY}/{me}", str(cfg.num_processes))
    wait_ms = int(cfg.initialization_timeout * 1000)
    counts = [
        cfg.num_processes if other == me else int(client.blocking_key_value_get(f"{_AGREEMENT_KEY}/{other}", wait_ms))
        for other in range(jax.process_count())
    ]
    different = {other: n for other, n in enumerate(counts) if n != cfg.num_processes}
    if not different:
        return None
    return (
        f"process {me} was launched with num_processes={cfg.num_processes} but process(es) "
        + ", ".join(f"{other} with num_processes={n}" for other, n in different.items())
        + "; launch every process with the same num_processes (and distinct process ids 0 .. "
        "num_processes-1)."
    )


def _shutdown_quietly(cfg: DistributedConfig) -> None:
    with contextlib.suppress(Exception):  # best effort, the real error is being reported
        peers.leave(cfg.heartbeat_timeout)
