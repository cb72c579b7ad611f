"""{workdir}/train.lock: one trainer per run directory."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from transformer_jax.errors import UserError

logger = logging.getLogger(__name__)

LOCK_FILENAME = "train.lock"


# ------------------------------------------------------------------------------------------------ the lock


class WorkdirBusyError(UserError, RuntimeError):
    """Another trainer holds the workdir."""


class TrainerLock:
    """{workdir}/train.lock, held by one trainer for its whole run: a second trainer on the same workdir refuses
    before touching it, naming the holder.

    The lock is an exclusive `fcntl.flock`, which the operating system releases when its process ends however
    it ends, so a lock left by a killed trainer is stale by construction; the file's content (host, process id,
    start time) names the holder for the refusal. A clean exit removes the file; one left behind is reported when
    it is taken over.
    """

    def __init__(self, workdir: str | Path):
        self.path = Path(workdir) / LOCK_FILENAME
        self._fd: int | None = None

    def __enter__(self) -> TrainerLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise WorkdirBusyError(
                    f"{self.path.parent} is in use by another trainer ({self._holder() or 'holder unknown'}); wait "
                    f"for it to finish or stop it, or train in another --workdir. Nothing was changed."
                ) from None
            if self._is_current(fd):
                break
            os.close(fd)  # its holder removed the file between our open and our lock: take the new one
        self._fd = fd
        previous = self._holder()
        if previous:
            logger.warning("%s was left by a trainer that is gone (%s); taking it over.", self.path, previous)
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().isoformat("T", "seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        return self

    def _is_current(self, fd: int) -> bool:
        """Whether the open file `fd` is still the one at self.path."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _holder(self) -> str:
        """'process P on host H since T' from the lock file, or '' if it is empty."""
        with contextlib.suppress(OSError, ValueError):
            holder = json.loads(self.path.read_text() or "null")
            if holder:
                return f"process {holder['pid']} on host {holder['host']} since {holder['since']}"
        return ""

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        self.path.unlink(missing_ok=True)  # released cleanly: no file left
        os.close(self._fd)  # releases the flock
        self._fd = None
