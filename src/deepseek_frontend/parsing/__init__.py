"""Output side: model text -> reasoning, content and DSML tool-call events.

Public entry points:

* :class:`StreamParser` -- ``feed(text) -> list[Event]``, ``finish(finish_reason) -> list[Event]``.
* :func:`parse_completion` -- a whole completion at once, as a :class:`ParsedMessage`.
* the event vocabulary (:data:`Event` and its members) and :func:`assemble_message`.
* :data:`GRAMMARS` -- family name -> :class:`DsmlGrammar` (one table of spellings per family).

The behaviour is specified by ``docs/spec/streaming-contract.md``; ``docs/parsing.md`` maps each
scenario to its test.
"""

from deepseek_frontend.parsing.events import (
    ContentDelta,
    Event,
    Finish,
    FinishReason,
    ParsedMessage,
    ParsedToolCall,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    assemble_message,
)
from deepseek_frontend.parsing.grammars import GRAMMARS, DsmlGrammar, Terminal, get_grammar
from deepseek_frontend.parsing.stream import StreamParser, parse_completion

__all__ = [
    "GRAMMARS",
    "ContentDelta",
    "DsmlGrammar",
    "Event",
    "Finish",
    "FinishReason",
    "ParsedMessage",
    "ParsedToolCall",
    "ReasoningDelta",
    "StreamParser",
    "Terminal",
    "ToolCallArgumentsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "assemble_message",
    "get_grammar",
    "parse_completion",
]
