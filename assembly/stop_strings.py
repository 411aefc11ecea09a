"""Stop strings that match across token boundaries and are never emitted.

Text arrives in deltas (one token's worth, or less). The matcher returns what
is safe to show: everything before the first stop string once one appears,
and otherwise everything except the longest suffix that could still grow into
a stop string (a prefix of one). That held-back suffix is released by `flush()`
when generation ends without a match.

Why searching only `held + new` suffices: the held text is the longest suffix
that is a prefix of some stop string, so any match that starts before it would
have made a longer suffix a prefix of that stop string.
"""


class StopStringMatcher:
    def __init__(self, stop_strings: tuple[str, ...] | list[str] = ()):
        if any(not s for s in stop_strings):
            raise ValueError("stop strings must not be empty")
        self.stop_strings = tuple(stop_strings)
        self._held = ""
        self.is_stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        """Add generated text; return (text safe to emit, whether a stop string was hit).

        After a hit, the stop string and anything after it are dropped for good."""
        if self.is_stopped:
            return "", True
        if not self.stop_strings:
            return text, False
        buffer = self._held + text
        stop_at = min((i for i in (buffer.find(s) for s in self.stop_strings) if i >= 0), default=-1)
        if stop_at >= 0:
            self._held = ""
            self.is_stopped = True
            return buffer[:stop_at], True
        num_held = self._num_partial_match(buffer)
        self._held = buffer[len(buffer) - num_held:] if num_held else ""
        return buffer[:len(buffer) - num_held], False

    def flush(self) -> str:
        """The held-back text, when generation ended without a stop string."""
        held, self._held = self._held, ""
        return held

    def _num_partial_match(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop_strings:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest
