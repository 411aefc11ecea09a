"""One server per tier directory: an exclusive flock on `<directory>/.lock`.

Several servers may share one RADIXSERVE_HOME. The first to open a model's tier gets
`<root>/<fingerprint>`; a second one running at the same time gets `<root>/<fingerprint>-2`, and
so on, so no two processes ever write or delete files in the same directory. The kernel drops
the lock when its process dies, SIGKILL included, so a restart gets its directory back.
"""

import fcntl
import os
from pathlib import Path

LOCK_FILE_NAME = ".lock"
MAX_SERVERS_PER_TIER = 8


class TierDirectoryBusy(Exception):
    """Every directory a tier may use is held by another running process."""


class TierDirectoryLock:
    """Holds the lock on ``path`` until ``release`` (or the process ends)."""

    def __init__(self, path: Path, lock_fd: int):
        self.path = path
        self._lock_fd: int | None = lock_fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None


def lock_tier_directory(root: Path, name: str) -> TierDirectoryLock:
    """Create and lock the first free of `root/name`, `root/name-2`, ...

    Raises TierDirectoryBusy when MAX_SERVERS_PER_TIER processes hold them all, OSError when
    the directory cannot be created."""
    for index in range(1, MAX_SERVERS_PER_TIER + 1):
        path = root / (name if index == 1 else f"{name}-{index}")
        path.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(path / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            continue
        return TierDirectoryLock(path, lock_fd)
    raise TierDirectoryBusy(
        f"the KV disk tiers under {root} for this model are all in use by {MAX_SERVERS_PER_TIER} "
        "other processes; give this one its own --kv-disk-dir or run it with --no-kv-disk"
    )
