"""The scripted engine every test that needs an :class:`Engine` uses: it yields what the test says,
records what it got, and fails where the test says.

:class:`ScriptedEngine` streams ``pieces`` (raw text, special-token spellings recognised), one
chunk each, then EOS when its ``finish`` is ``"stop"`` -- so each test controls the exact chunking --
or, given ``chunks``, those chunks as they are. ``fail_at`` raises before that chunk (0: before the
first, :class:`EngineUnavailableError`, retryable; later: :class:`EngineStreamError`), ``error`` is
raised once the script is through. ``constraints`` are the kinds it enforces, ``caps`` what it
reports as its workers' capabilities. ``requests`` collects every request it got, ``closed`` the ids
of the streams closed before their end (aborts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from deepseek_frontend.engines.base import Engine
from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError
from deepseek_frontend.generation import (
    ConstraintKind,
    EngineChunk,
    EngineFinishReason,
    GenerateRequest,
    WorkerCapabilities,
    WorkerStatus,
)
from deepseek_frontend.tokenization import PromptTokenizer

__all__ = ["ALL_CONSTRAINTS", "ScriptedEngine"]

#: every constraint kind (an engine that enforces whatever it is asked to)
ALL_CONSTRAINTS: frozenset[ConstraintKind] = frozenset({"ebnf", "json_schema", "regex", "structural_tag"})


@dataclass(eq=False)
class ScriptedEngine(Engine):
    """An :class:`Engine` that plays a script (see module docstring).

    Each piece's chunk reports ``prompt_tokens`` (the request's), ``completion_tokens`` (so far) and
    ``cached_tokens`` 3; the last one has finish ``finish``. ``chunks``, when given, are yielded as
    they are instead (with no EOS of their own).
    """

    tokenizer: PromptTokenizer
    pieces: Sequence[str] = ()
    finish: EngineFinishReason = "stop"
    fail_at: int | None = None
    error: Exception | None = None
    chunks: Sequence[EngineChunk] | None = None
    constraints: frozenset[ConstraintKind] = frozenset({"ebnf", "json_schema"})
    caps: WorkerCapabilities | None = None
    requests: list[GenerateRequest] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    name: str = "scripted"

    def _script(self, request: GenerateRequest) -> list[EngineChunk]:
        if self.chunks is not None:
            return list(self.chunks)
        ids = [self.tokenizer.encode_raw(p) for p in self.pieces]
        if self.finish == "stop":
            ids.append([self.tokenizer.eos_token_id])
        script, emitted = [], 0
        for i, chunk_ids in enumerate(ids):
            emitted += len(chunk_ids)
            last = i == len(ids) - 1
            script.append(
                EngineChunk(
                    chunk_ids,
                    self.finish if last else None,
                    prompt_tokens=len(request.input_ids),
                    completion_tokens=emitted,
                    cached_tokens=3,
                )
            )
        return script

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        self.requests.append(request)
        done = False
        try:
            for i, chunk in enumerate(self._script(request)):
                if self.fail_at == i:
                    if i == 0:
                        raise EngineUnavailableError("scripted failure before the first token")
                    raise EngineStreamError("scripted failure mid-stream")
                yield chunk
            if self.error is not None:
                raise self.error
            done = True
        finally:
            if not done:
                self.closed.append(request.request_id)

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        return kind in self.constraints

    def capabilities(self) -> WorkerCapabilities | None:
        return self.caps

    def statuses(self) -> list[WorkerStatus]:
        return [WorkerStatus(url=self.name, healthy=True)]

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
