"""Which requests take the event loop's turns first.

Every step of a request on the event loop runs in a loop turn (``pipeline.offload.LoopTurns``), so
that a burst of requests cannot fill one loop iteration while ``/live`` and everyone else wait.

* :class:`TurnGate` -- each ``POST`` request's first steps (routing, admission, up to reading the
  body) take an urgent turn.
* :class:`RecentHeads` -- whether a request body starts like a recent one (:data:`HEAD_BYTES`): a
  follow-up of a recent conversation, whose prompt work is cheap, is *warm* and goes first
  (:func:`~deepseek_frontend.edge.body.read_json`; the HTTP protocol's arrival pacing, which
  leaves its verdict in the scope at :data:`WARM_KEY`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from deepseek_frontend.pipeline.offload import CURRENT_TURN, release_current_turn

#: bytes of a request body that make its head (:class:`RecentHeads`)
HEAD_BYTES = 4096
#: the scope key where the HTTP protocol leaves its verdict on a body's head (True: a recent
#: conversation's), so that the application does not judge the same body a second time
WARM_KEY = "deepseek_frontend.warm"
#: request heads remembered (one int each)
RECENT_HEADS = 4096


class RecentHeads:
    """Which request bodies started with the same bytes as a recent one: a bounded LRU of
    fingerprints of their first :data:`HEAD_BYTES` bytes.

    An agent resends its whole conversation every turn, so its next request starts like its last
    one, and that conversation's prompt is in the tokenizer's caches: preparing it is cheap. Such a
    request takes an urgent loop turn (``LoopTurns``) and so is not queued behind a burst of cold
    prompts. A wrong guess only reorders the queue: every request is still served, and a cold one
    sent ahead does its tokenizing on the offload threads all the same.
    """

    __slots__ = ("_seen", "max_entries")

    def __init__(self, max_entries: int = RECENT_HEADS) -> None:
        self.max_entries = max_entries
        self._seen: OrderedDict[int, None] = OrderedDict()

    def seen_before(self, body: bytes | bytearray) -> bool:
        """Whether a recent body started with the same bytes; then remember this one's head.

        ``body`` may be the HTTP protocol's ``bytearray`` buffer: either way its head is copied
        once, to be hashed."""
        key = hash(bytes(memoryview(body)[:HEAD_BYTES]))
        seen = self._seen
        if key in seen:
            seen.move_to_end(key)
            return True
        seen[key] = None
        if len(seen) > self.max_entries:
            seen.popitem(last=False)
        return False


class TurnGate:
    """Pure-ASGI middleware: each ``POST`` request starts by taking a loop turn (see ``LoopTurns``).

    A burst of thousands of requests would otherwise run thousands of routing, validation and
    admission steps in one event-loop iteration, and ``/live`` would wait behind all of them. Here a
    request's first step only queues; the turn is handed on when the request reads its body, waits
    on the engine or ends. Other methods (``GET /live``, ``/health``, ``/metrics``) pass straight
    through.

    That first step (routing, admission, up to reading the body) is short, so it takes an urgent
    turn: arrivals are not queued behind the prompt work of the cold requests before them, and a
    follow-up of a recent conversation reaches its own (urgent) prompt turn at once (``read_json``).
    """

    def __init__(self, app: ASGIApp, turns: Any) -> None:
        self.app = app
        self.turns = turns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        token = CURRENT_TURN.set(await self.turns.take(urgent=True))
        try:
            await self.app(scope, receive, send)
        finally:
            release_current_turn()
            CURRENT_TURN.reset(token)
