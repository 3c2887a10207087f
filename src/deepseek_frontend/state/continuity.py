"""Reasoning continuity: the reasoning of a tool-calling answer, restored when a client sends the
turn back without it.

DeepSeek's thinking models need the reasoning of the current tool loop in the prompt: the format
renders each assistant turn's ``reasoning_content``, and a turn rendered without the reasoning
the model wrote is a prompt it was never trained on (DeepSeek's own API refuses such a tool
turn). Many OpenAI-shaped clients drop ``reasoning_content`` (or Responses ``reasoning`` items)
when they replay a conversation. So when an answer calls tools, its reasoning is kept in the
state store (:meth:`~deepseek_frontend.state.StateStore.put_reasoning`) under a key made of
the answer's tool-call ids and its text, for the API key that asked; a later request of the same
key whose assistant turn has those tool-call ids and that text, and no reasoning, gets the
reasoning back -- the prompt is then exactly the one a client that kept it would render.

Never guessing: only a turn with tool calls is matched (the ids are random, handed out by this
server: no other conversation has them), the text must be byte-equal to what was returned, and
a turn that carries reasoning of its own is left as sent. Bounded by the store's retention
(``--state-ttl``, ``--state-max-bytes``) and never across API keys. Restorations are counted in
``deepseek_frontend_reasoning_restored_total{api}``.

Used by ``/v1/chat/completions``, ``/v1/responses`` and ``/v1/messages`` (keyed there by the
``toolu_`` ids the Anthropic encoder hands out; its per-process store of withheld reasoning,
``api/anthropic/hidden_thinking.py``, is consulted first). The server makes one
:class:`ReasoningContinuity` over its store (``FrontendState.continuity``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from deepseek_frontend.pipeline.chat import ChoiceAccumulator, PipelineChunk

from .store import StateStore

if TYPE_CHECKING:
    from prometheus_client import Counter

__all__ = ["IdsOf", "ReasoningContinuity", "turn_key"]

#: the tool-call ids a client was shown for an answer's calls, or None when not all are known
IdsOf = Callable[[ChoiceAccumulator], "list[str] | None"]

log = logging.getLogger("deepseek_frontend.api")


def _text(content: Any) -> str | None:
    """The text of an assistant turn as a client sent it back: a string (``None`` -> empty), or a
    list of exactly one text part; anything else matches nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def turn_key(text: str, call_ids: Sequence[str]) -> str | None:
    """The key of an assistant turn: a SHA-256 of its tool-call ids (in order) and its text;
    ``None`` for a turn without tool calls (nothing unguessable to match it by)."""
    if not call_ids:
        return None
    digest = hashlib.sha256()
    for call_id in call_ids:
        digest.update(call_id.encode() + b"\0")
    digest.update(b"\1" + text.encode())
    return "turn:" + digest.hexdigest()


class ReasoningContinuity:
    """Keeps and restores tool-loop reasoning in ``store``; counts restorations in ``restored``."""

    def __init__(self, store: StateStore, restored: Counter) -> None:
        self.store = store
        self.restored = restored

    async def restore(self, owner: str, messages: list[dict[str, Any]], api: str) -> int:
        """Fill the ``reasoning_content`` of assistant tool-call turns of ``messages`` (OpenAI-style
        chat messages, changed in place) that have none and match a kept answer; how many."""
        if not self.store.enabled:
            return 0
        wanted: list[tuple[dict[str, Any], str]] = []
        for message in messages:
            if message.get("role") != "assistant" or message.get("reasoning_content"):
                continue
            calls = message.get("tool_calls") or []
            text = _text(message.get("content"))
            key = turn_key(text, [str(c.get("id") or "") for c in calls]) if text is not None else None
            if key is not None:
                wanted.append((message, key))
        if not wanted:
            return 0
        found = await self.store.get_reasonings(owner, [key for _, key in wanted])  # one look-up for all
        restored = 0
        for message, key in wanted:
            reasoning = found.get(key)
            if reasoning:
                message["reasoning_content"] = reasoning
                restored += 1
        if restored:
            self.restored.labels(api).inc(restored)
        return restored

    async def remember(self, owner: str, acc: ChoiceAccumulator, ids_of: IdsOf | None = None) -> None:
        """Keep the reasoning of a finished answer that called tools (nothing else is kept).
        ``ids_of`` gives the ids the client was shown for the answer's calls (None: not all known,
        keep nothing); by default the calls' own ids."""
        reasoning = acc.reasoning_content
        ids = [call.id for call in acc.tool_calls] if ids_of is None else ids_of(acc)
        if ids is None:
            return
        key = turn_key(acc.content, ids)
        if key is None or not reasoning or not self.store.enabled:
            return
        try:
            await self.store.put_reasoning(owner, key, reasoning)
        except Exception:  # continuity is best effort: the answer itself must not fail for it
            log.exception("keeping the reasoning of a tool-calling answer failed")

    def wrap(self, owner: str, ids_of: IdsOf | None = None) -> Callable[[Sequence[Any]], list[Any]]:
        """A function wrapping started choice streams so each remembers its answer at its end
        (``ids_of``: as in :meth:`remember`, for an API that shows its own tool-call ids).

        Without a store (``--state-store none``) there is nowhere to keep an answer: the streams
        are returned as they are, without the wrapper's layer and accumulation on every chunk.
        """

        def wrap(streams: Sequence[Any]) -> list[Any]:
            if not self.store.enabled:
                return list(streams)
            return [_Remembering(stream, lambda acc: self.remember(owner, acc, ids_of)) for stream in streams]

        return wrap


class _Remembering:
    """A started ``ChoiceStream`` whose last chunk is held back until the answer was remembered:
    a client that replays the turn at once (it has the tool calls only after that chunk) finds it."""

    __slots__ = ("_acc", "_on_end", "_stream")

    def __init__(self, stream: Any, on_end: Callable[[ChoiceAccumulator], Awaitable[None]]) -> None:
        self._stream = stream
        self._on_end = on_end
        self._acc = ChoiceAccumulator(stream.index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def __aiter__(self) -> AsyncIterator[PipelineChunk]:
        async for chunk in self._stream:
            self._acc.add(chunk)
            if chunk.end is not None:
                await self._on_end(self._acc)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()
