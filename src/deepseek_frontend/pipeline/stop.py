"""Frontend-side stop strings.

Engines in token mode do not match stop strings (SGLang rejects them), so the
frontend does, over the answer text as it streams. Text that could be the start
of a stop string is held back until the next piece decides it, so a stop split
across engine chunks (``"EN"`` + ``"D"``) still matches and never leaks.

Example with stop ``["END"]``::

    m = StopStringMatcher(["END"])
    m.feed("abcE")   -> ("abc", None)      # "E" held: may start "END"
    m.feed("Nx")     -> ("ENx", None)      # "ENx" cannot be "END": released
    m.feed("yEND!")  -> ("y", "END")       # matched: text after it is dropped
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Finds the first occurrence of any stop string in a stream of text pieces.

    After a match the matcher is done: further ``feed`` calls return nothing.
    Work per call is proportional to the piece length times the number of stop
    strings (the held tail is shorter than the longest stop string).
    """

    __slots__ = ("_held", "_max_hold", "_stops", "matched")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        #: the stop string that matched, once one has
        self.matched: str | None = None

    def __bool__(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, str | None]:
        """``(text safe to emit, matched stop or None)`` after appending ``text``.

        A match is committed only when no other stop string could still start
        earlier: with stops ``["E", "bED"]``, ``"DbE"`` holds ``"bE"`` because
        ``"bED"`` may complete and starts first (the one-shot answer).
        """
        if self.matched is not None:
            return "", self.matched
        buf = self._held + text
        at, stop = self._first_match(buf)
        hold = self._hold_length(buf)
        open_from = len(buf) - hold  # where the earliest still-open partial stop starts
        if stop is not None and at <= open_from:
            self._held = ""
            self.matched = stop
            return buf[:at], stop
        if hold:
            self._held = buf[open_from:]
            return buf[:open_from], None
        self._held = ""
        return buf, None

    def flush(self) -> str:
        """The held tail when the stream ends: up to a stop it contains (then ``matched`` is set)."""
        held, self._held = self._held, ""
        if self.matched is not None:
            return ""
        at, stop = self._first_match(held)
        if stop is not None:
            self.matched = stop
            return held[:at]
        return held

    def _first_match(self, buf: str) -> tuple[int, str | None]:
        """Earliest start of any stop string in ``buf`` (the longest stop on a tie)."""
        best, best_stop = -1, None
        for stop in self._stops:
            i = buf.find(stop)
            if i != -1 and (best_stop is None or i < best or (i == best and len(stop) > len(best_stop))):
                best, best_stop = i, stop
        return best, best_stop

    def _hold_length(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string."""
        for k in range(min(len(buf), self._max_hold), 0, -1):
            tail = buf[-k:]
            for stop in self._stops:
                if stop.startswith(tail):
                    return k
        return 0
