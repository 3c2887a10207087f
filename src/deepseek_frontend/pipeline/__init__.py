"""The protocol-neutral serving core: typed request in, parser events out.

``chat.py`` holds the pipeline (ChatRequest -> PreparedRequest -> ChoiceStream -> PipelineChunk)
and ``stop.py`` the frontend-side stop strings. The protocol packages under ``api/`` map their
JSON onto a ChatRequest and render PipelineChunks; nothing here knows an API's wire shape.
"""

from deepseek_frontend.pipeline.chat import (
    ChatPipeline,
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PipelineChunk,
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
    "PreparedRequest",
    "PromptRenderer",
    "StreamEnd",
    "Usage",
]
