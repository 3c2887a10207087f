"""The reasoning of answers that did not show it, kept to render the tool loop that follows.

Anthropic's Messages API returns ``thinking`` blocks only to a request that enables
thinking; a request without a ``thinking`` field still runs the model in the server's
default mode (``--default-thinking``), so the model may reason where the client sees
none of it. The client's next request then replays the assistant turn without its
thinking blocks. DeepSeek's formats render the reasoning of every assistant turn of a
conversation with tools (and always of the current tool loop): rendering that turn with
an empty reasoning would change the prompt the model generated against -- it would lose
its own reasoning mid-loop and the engine's prefix cache would miss from that turn on.

:class:`HiddenReasoning` remembers the hidden reasoning of an answer that called tools,
keyed by the answer's ``toolu_`` ids (fresh random ids: only the client that received
them can name them), and :meth:`HiddenReasoning.restore` puts it back into a replayed
assistant turn that carries no reasoning of its own. A turn whose ids are unknown (evicted,
answered by another frontend process, or written by the client) renders with an empty
reasoning, as DeepSeek's reference encoder renders a turn without ``reasoning_content``.

The store is bounded (entries and characters; least recently used go first) and per
process: nothing here outlives the process or grows with traffic.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

__all__ = ["HIDDEN_REASONING", "HiddenReasoning"]


class HiddenReasoning:
    """A bounded LRU map: tool-call id -> the reasoning of the answer that made the call.

    ``max_entries`` bounds the ids held; ``max_chars`` bounds the reasoning text held
    (each id counts its answer's whole reasoning, so the bound is conservative when one
    answer made several calls -- they share one string object). Thread-safe.
    """

    def __init__(self, max_entries: int = 16_384, max_chars: int = 16_000_000) -> None:
        if max_entries < 1 or max_chars < 1:
            raise ValueError("max_entries and max_chars must be positive")
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._items: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def chars(self) -> int:
        """The reasoning characters currently counted against ``max_chars``."""
        return self._chars

    def remember(self, call_ids: Iterable[str], reasoning: str) -> None:
        """Keep ``reasoning`` under each of ``call_ids`` (an empty reasoning is not kept)."""
        if not reasoning or len(reasoning) > self.max_chars:
            return
        with self._lock:
            for call_id in call_ids:
                old = self._items.pop(call_id, None)
                if old is not None:
                    self._chars -= len(old)
                self._items[call_id] = reasoning
                self._chars += len(reasoning)
            while len(self._items) > self.max_entries or self._chars > self.max_chars:
                _, evicted = self._items.popitem(last=False)
                self._chars -= len(evicted)

    def lookup(self, call_ids: Iterable[str]) -> str | None:
        """The reasoning kept under the first of ``call_ids`` that is known, else ``None``."""
        with self._lock:
            for call_id in call_ids:
                reasoning = self._items.get(call_id)
                if reasoning is not None:
                    self._items.move_to_end(call_id)
                    return reasoning
        return None

    def restore(self, messages: list[dict[str, Any]]) -> int:
        """Fill ``reasoning_content`` of assistant tool-call turns that have none; returns how many.

        ``messages`` are the converted (OpenAI-style) chat messages; they are changed in place.
        A turn that carries reasoning (the client replayed its thinking blocks) is left as sent.
        """
        restored = 0
        for message in messages:
            if message.get("role") != "assistant" or message.get("reasoning_content"):
                continue
            calls = message.get("tool_calls")
            if not calls:
                continue
            reasoning = self.lookup(str(call.get("id", "")) for call in calls)
            if reasoning is not None:
                message["reasoning_content"] = reasoning
                restored += 1
        return restored

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._chars = 0


#: The process's store, shared by ``/v1/messages`` and ``/v1/messages/count_tokens``.
HIDDEN_REASONING = HiddenReasoning()
