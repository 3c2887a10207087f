"""What the pipeline needs from the metrics sink it is handed, and what a choice's stream reads
of the pipeline that runs it.

Both are structural (``typing.Protocol``): the serving layer passes its metrics registry, tests
pass fakes, and this package imports neither; the choice stream names the pipeline by what it
reads, so ``stream.py`` does not import ``chat.py``, which imports it. The engine the pipeline
sends requests to is typed by its interface, :class:`deepseek_frontend.engines.base.Engine`
(the engines layer is below this one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import Engine
    from deepseek_frontend.tokenization import PromptTokenizer

    from .backlog import PromptBacklog


class Observations(Protocol):
    """A distribution the pipeline adds durations to (a histogram)."""

    def observe(self, value: float) -> None: ...


class Tally(Protocol):
    """A count the pipeline adds to (a counter)."""

    def inc(self, amount: float = 1) -> None: ...


class RequestRecords(Protocol):
    """Per-request figures: when the first token came, and what the request used."""

    def first_token(self, request_id: str, seconds: float) -> None: ...

    def usage(self, request_id: str, model: str, prompt: int, cached: int, completion: int) -> None: ...


class PipelineMetrics(Protocol):
    """The metrics the pipeline records (read-only members: plain attributes satisfy them)."""

    @property
    def tokenization(self) -> Observations:
        """Seconds spent rendering and tokenizing one prompt."""
        ...

    @property
    def ttft(self) -> Observations:
        """Seconds from a request's arrival to its first engine chunk."""
        ...

    @property
    def itl(self) -> Observations:
        """Seconds between two engine chunks of one choice."""
        ...

    @property
    def detokenization(self) -> Observations:
        """Seconds one choice spent detokenizing and parsing its output."""
        ...

    @property
    def generation_tokens(self) -> Tally:
        """Completion tokens generated."""
        ...

    @property
    def dropped_tool_calls(self) -> Tally:
        """Calls to tools the request did not declare, dropped from the output."""
        ...

    @property
    def ledger(self) -> RequestRecords:
        """The per-request figures."""
        ...


class StreamSource(Protocol):
    """What a choice's stream (``stream.ChoiceStream``) reads of the pipeline that runs it."""

    @property
    def metrics(self) -> PipelineMetrics | None:
        """Where the stream records its timings and counts (None: nowhere)."""
        ...

    @property
    def engine(self) -> Engine:
        """The engine the stream's request goes to."""
        ...

    @property
    def tokenizer(self) -> PromptTokenizer:
        """The model's tokenizer (its detokenizer decodes the stream)."""
        ...

    @property
    def family(self) -> str:
        """The model family (its output grammar parses the stream)."""
        ...

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the vocabulary's special tokens."""
        ...

    @property
    def eos_token_id(self) -> int:
        """The end-of-sequence id."""
        ...

    @property
    def backlog(self) -> PromptBacklog:
        """Whether prompt work waits, which the stream's next chunk waits for (``backlog.py``)."""
        ...
