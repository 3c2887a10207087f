"""The settings the pipeline reads, as its own frozen record.

The serving layer above keeps many more settings (listen address, limits on clients, model
aliases, ...). The pipeline needs only the model's identity, the context it must fit, the
server's default output length and how it spreads prompt work over the event loop and its
threads: :class:`PipelineConfig` holds exactly those. Whoever composes the server builds it
from its own typed settings (``server/compose.py``), so this package imports nothing from the
layer that builds it and reads nothing of that layer by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backlog import STREAM_YIELD_MS
from .offload import OFFLOAD_THREADS

#: prompts with at least this many characters of text the prompt caches do not hold are tokenized
#: on the offload threads (cold tokenization runs at roughly 1-3 MB/s: 2 K characters cost about
#: 1 ms, which a thread hop is worth)
OFFLOAD_MIN_CHARS = 2048
#: requests with at least this many characters of text are rendered and looked up in the caches
#: on the offload threads as well (a warm 256 K-character prompt costs about 2 ms on the loop)
OFFLOAD_PREPARE_CHARS = 262_144


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What the pipeline reads of the server's settings."""

    #: the model name responses carry (shown in ``repr``)
    served_model_name: str
    #: the chat-format family (``deepseek_v4``, ``deepseek_v41``, ``deepseek_v32``, ...)
    family: str
    #: the engine kind, named in errors about what its workers cannot do
    engine: str
    #: the frontend's context length (prompt + output tokens); the workers' wins when smaller
    context_length: int
    #: the reasoning-effort profile the renderer applies (``preview``, ``official``, ``release``, ...)
    reasoning_effort_profile: str
    #: cap on the output of a request without ``max_tokens`` (None: the room left in the context)
    default_max_tokens: int | None = None
    #: threads rendering and tokenizing long prompts off the event loop
    offload_threads: int = OFFLOAD_THREADS
    #: prompts with at least this many characters of uncached text are tokenized off the event loop
    offload_min_chars: int = OFFLOAD_MIN_CHARS
    #: requests with at least this many characters of text are also rendered off the event loop
    offload_prepare_chars: int = OFFLOAD_PREPARE_CHARS
    #: the longest a running stream's next chunk waits for prompt work queued before it, in
    #: milliseconds (pipeline/backlog.py; 0: never)
    stream_yield_ms: float = STREAM_YIELD_MS
