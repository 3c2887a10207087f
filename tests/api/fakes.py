"""A scripted engine for pipeline tests: yields given texts as token-id chunks, records what it saw."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from deepseek_frontend.engines.base import EngineChunk, GenerateRequest
from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError
from deepseek_frontend.tokenization import PromptTokenizer


@dataclass
class ScriptedEngine:
    """Streams ``pieces`` (raw text, special spellings recognised) one chunk each, then EOS.

    ``fail_at``: raise before chunk ``fail_at`` (0: before the first, retryable).
    ``closed`` collects request ids whose stream was closed before its end (aborts).
    """

    tokenizer: PromptTokenizer
    pieces: Sequence[str] = ()
    finish: str = "stop"
    fail_at: int | None = None
    constraints: frozenset[str] = frozenset({"ebnf", "json_schema"})
    requests: list[GenerateRequest] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    name: str = "scripted"

    def supports_constraint(self, kind: str) -> bool:
        return kind in self.constraints

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        self.requests.append(request)
        chunks = [self.tokenizer.encode_raw(p) for p in self.pieces]
        if self.finish == "stop":
            chunks.append([self.tokenizer.eos_token_id])
        done = False
        emitted = 0
        try:
            for i, ids in enumerate(chunks):
                if self.fail_at == i:
                    if i == 0:
                        raise EngineUnavailableError("scripted failure before the first token")
                    raise EngineStreamError("scripted failure mid-stream")
                emitted += len(ids)
                last = i == len(chunks) - 1
                yield EngineChunk(
                    ids,
                    self.finish if last else None,
                    prompt_tokens=len(request.input_ids),
                    completion_tokens=emitted,
                    cached_tokens=3,
                )
            done = True
        finally:
            if not done:
                self.closed.append(request.request_id)
