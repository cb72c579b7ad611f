"""The processes of a multi-host run after start-up (distributed.initialize): a lost one noticed, and leaving in order.

    peers.PeerWatch.start(heartbeat_timeout)       # a thread that ends this process when another one is lost
    peers.report_progress(lambda: (update, saved_updates, checkpoint_dir))   # for that line, from the training loop
    peers.end_after_failed_collective(error)      # a collective failed and lost_a_peer(error): the same line
    peers.shutdown()                              # at exit: every process meets, process 0 stops last

A process that dies or stops responding ends the others with one line (which process, the update, the newest
checkpoint, how to resume) and PEER_LOST_EXIT_CODE; the relaunch resumes from the newest intact checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

import jax

PEER_LOST_EXIT_CODE = 4


def coordination_client():
    """The coordination service's client, as jax's own array_serialization and orbax reach it."""
    from jax._src.distributed import global_state

    assert global_state.client is not None, "called after jax.distributed.initialize, which makes the client"
    return global_state.client


# Words of the runtime's errors when a collective's peer is gone (gloo on CPUs, NCCL on GPUs, the coordination
# service); another runtime error (out of memory, a bad program) is not a lost peer.
_LOST_PEER_WORDS = ("gloo", "nccl", "connection", "peer", "socket", "unavailable", "deadline_exceeded", "heartbeat")


def lost_a_peer(error: Exception) -> bool:
    """Whether a runtime error of a multi-process run says another process died or cannot be reached."""
    text = str(error).lower()
    return jax.process_count() > 1 and any(word in text for word in _LOST_PEER_WORDS)


# () -> (the update the run is at, the updates saved as checkpoints, their directory); set by the training loop.
Progress = Callable[[], tuple[int, list[int], str]]
_progress: Progress | None = None
_ending = threading.Lock()  # one line, from whichever thread notices first
_LEAVE_BARRIER = "transformer_jax/leave"


def report_progress(progress: Progress | None) -> None:
    """Where the run is, for the line of a lost peer (None: outside the training loop)."""
    global _progress
    _progress = progress


def end_after_lost_peer(who: str, how: str) -> NoReturn:
    """Another process (`who`) died or stopped responding (`how` says how it showed). Prints one line (this process, the
    update, the newest checkpoint, how to resume) and ends this process at once with PEER_LOST_EXIT_CODE: nothing
    can finish cleanly, since the checkpointer's barriers and the runtime's teardown would wait for the lost one."""
    _ending.acquire()  # a second caller waits here for the first one's exit
    me, count = jax.process_index(), jax.process_count()
    if _progress is None:
        when, saved = "outside the training loop", "see the workdir's checkpoints"
    else:
        update, checkpoints, where = _progress()
        when = f"at update {update}"
        saved = f"the newest checkpoint is update {max(checkpoints)} in {where}" if checkpoints else "no checkpoint yet"
    print(
        f"PeerLostError: process {me} of {count} lost {who} {when} ({how}); {saved}. Nothing is wrong with the run's "
        "settings: relaunch the same command on every host and training resumes from the newest intact checkpoint.",
        file=sys.stderr,
        flush=True,
    )
    os._exit(PEER_LOST_EXIT_CODE)


def end_after_failed_collective(error: Exception) -> NoReturn:
    """end_after_lost_peer for a collective that failed with `error` (lost_a_peer(error) is true)."""
    reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    other = f"process {1 - jax.process_index()}" if jax.process_count() == 2 else "another process"
    end_after_lost_peer(other, f"a collective failed: {reason}")


class PeerWatch:
    """Ends this process by end_after_lost_peer when another process of the run dies or stops responding.

    A daemon thread asks the coordination service which processes are alive, over and over: the service answers
    once every live process has asked, or once one has missed its heartbeats for heartbeat_timeout seconds. A
    process gone before this one began to leave (`shutdown`) was lost.
    """

    active: PeerWatch | None = None

    def __init__(self, heartbeat_timeout: int):
        self.heartbeat_timeout = heartbeat_timeout
        self.leaving = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="PeerWatch", daemon=True)

    @classmethod
    def start(cls, heartbeat_timeout: int) -> None:
        cls.active = cls(heartbeat_timeout)
        cls.active._thread.start()

    def _watch(self) -> None:
        client, everyone = coordination_client(), list(range(jax.process_count()))
        while not self.leaving.is_set():
            try:
                live = set(client.get_live_nodes(everyone))  # a dict (jax 0.12) or a list (jax 0.7) of ids
            except Exception as error:  # the service itself is gone
                if self.leaving.is_set():
                    return
                reason = str(error).strip().splitlines()[0][:200]
                end_after_lost_peer("process 0", f"the coordination service it hosts stopped answering: {reason}")
            if live != set(everyone) and not self.leaving.is_set():
                lost = ", ".join(str(i) for i in sorted(set(everyone) - live))
                end_after_lost_peer(
                    f"process {lost}",
                    f"no heartbeat for heartbeat_timeout={self.heartbeat_timeout} s: it died, hangs or cannot be "
                    "reached",
                )
            time.sleep(1.0)


def leave(heartbeat_timeout: int) -> None:
    """Leaves the run in order: every process meets at a barrier (a process that does not come within the timeout
    was lost; leaving goes on), and process 0, which hosts the coordination service, stops last, once the others
    have disconnected: a process still connected when the service stops is aborted by the runtime."""
    from jax._src.distributed import global_state

    client, timeout = global_state.client, max(60, heartbeat_timeout)
    if client is None:  # never connected: nothing to leave in order
        jax.distributed.shutdown()
        return
    with contextlib.suppress(Exception):
        client.wait_at_barrier(_LEAVE_BARRIER, 1000 * timeout)
    if jax.process_index() == 0:
        everyone, deadline = list(range(jax.process_count())), time.monotonic() + heartbeat_timeout + 10
        with contextlib.suppress(Exception):
            while set(client.get_live_nodes(everyone)) != {0} and time.monotonic() < deadline:
                time.sleep(0.2)
    jax.distributed.shutdown()


def shutdown() -> None:
    """Leaves the distributed run once every process has come to its end (`leave`); a no-op for one process. Runs at
    exit."""
    watch, PeerWatch.active = PeerWatch.active, None
    if watch is None or not jax.distributed.is_initialized():
        return
    watch.leaving.set()
    leave(watch.heartbeat_timeout)
