"""Prefix pins' settings (engine/prefix_pins.py holds the pins; the server asks for them)."""

from dataclasses import dataclass

from engine.setting import setting

DEFAULT_TOOL_PIN_SECONDS = 30.0  # a tool-call turn's cached prefix outlives eviction this long
DEFAULT_MAX_PIN_SECONDS = 3600.0  # longer cache TTLs (OpenAI's 12h / 24h) are cut to this until a disk tier holds them


@dataclass(frozen=True)
class PinConfig:
    tool_seconds: float = setting(
        DEFAULT_TOOL_PIN_SECONDS, "keep a turn that ends in tool calls cached this long, for the tool's result "
        "(0: off)", flag="--tool-pin-seconds", metavar="S", show=lambda seconds: f"{seconds:g}")
    max_seconds: float = setting(
        DEFAULT_MAX_PIN_SECONDS, "the longest a cache breakpoint (cache_control, prompt_cache_breakpoint) keeps its "
        "prefix from eviction", flag="--max-pin-seconds", metavar="S", show=lambda seconds: f"{seconds:g}")

    def __post_init__(self):
        if not 0 <= self.tool_seconds <= 3600:
            raise ValueError(f"tool pin seconds must be in [0, 3600], got {self.tool_seconds}")
        if not 0 <= self.max_seconds <= 86400:
            raise ValueError(f"max pin seconds must be in [0, 86400], got {self.max_seconds}")
