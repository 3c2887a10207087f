"""The protocol-neutral serving core: typed request in, parser events out.

``chat.py`` holds :class:`ChatPipeline`, the facade over the pipeline (ChatRequest ->
PreparedRequest -> ChoiceStream -> PipelineChunk), and re-exports the names of the modules
beside it: ``config`` (the settings it reads), ``interfaces`` (the metrics it is handed, and what
a choice's stream reads of the pipeline), ``request`` (request and result records), ``render``
(prompt rendering), ``prepare`` (rendering and tokenizing on the loop or the offload threads),
``planning`` (context fit, constraint, sampling), ``stream`` (one choice's engine request and
output) and ``accumulate`` (merging and folding choices). ``offload.py`` runs heavy prompt work off
the event loop and ``stop.py`` matches frontend-side stop strings. The engine it sends requests to
is an :class:`~deepseek_frontend.engines.base.Engine`. The protocol packages under ``api/`` map
their JSON onto a ChatRequest and render PipelineChunks; nothing here knows an API's wire shape or
imports from ``api/``.
"""

from deepseek_frontend.pipeline.chat import (
    ChatPipeline,
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PipelineChunk,
    PipelineConfig,
    PreparedRequest,
    PromptRenderer,
    StreamEnd,
    Usage,
)

__all__ = [
    "ChatPipeline",
    "ChatRequest",
    "ChoiceAccumulator",
    "ChoiceStream",
    "PipelineChunk",
    "PipelineConfig",
    "PreparedRequest",
    "PromptRenderer",
    "StreamEnd",
    "Usage",
]
