"""The disk tier of KV pages' settings (engine/kv_tier_link.py runs it)."""

from dataclasses import dataclass
from pathlib import Path

from engine.setting import parse_size, setting, show_size

DEFAULT_KV_DISK_BYTES = 4 << 30
KV_DISK_POLICIES = ("write-through", "write-back")  # every page at once / a page when the pool evicts it


def _parse_directory(text: str) -> Path:
    return Path(text).expanduser()


@dataclass(frozen=True)
class KVDiskConfig:
    # The tier's root (the model's tier is a fingerprint-named directory under it), or None for no tier.
    # `serve` turns it on under $RADIXSERVE_HOME/kv unless --no-kv-disk (server/serve_command.py).
    directory: Path | None = setting(
        None, "where KV pages outlive the pool and restarts, one subdirectory per model and KV layout "
        "(default: $RADIXSERVE_HOME/kv)", flag="--kv-disk-dir", parse=_parse_directory, metavar="DIR")
    max_bytes: int = setting(
        DEFAULT_KV_DISK_BYTES, "the disk tier's bound, least recently used pages deleted first",
        flag="--kv-disk-bytes", parse=parse_size, metavar="SIZE", show=show_size)
    policy: str = setting(
        "write-through", "write every cached page at once (survives a crash), or a page when the pool evicts it "
        "(fewer writes)", flag="--kv-disk-policy", choices=KV_DISK_POLICIES)

    def __post_init__(self):
        if self.max_bytes <= 0:
            raise ValueError(f"kv disk bytes must be positive, got {self.max_bytes}")
        if self.policy not in KV_DISK_POLICIES:
            raise ValueError(f"kv disk policy must be one of {', '.join(KV_DISK_POLICIES)}, got {self.policy!r}")
