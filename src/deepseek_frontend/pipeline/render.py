"""Rendering a :class:`ChatRequest` into prompt segments with one family's chat format.

:class:`PromptRenderer` is shared by the pipeline and the offline ``render`` / ``tokenize``
commands, so both produce the same prompt for the same request; :func:`prompt_tools` decides
which tools that prompt declares. Neither touches a tokenizer or an engine.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from deepseek_frontend.errors import RequestError

from .request import ChatRequest

if TYPE_CHECKING:
    from deepseek_frontend.formats.segments import PromptSegment


def prompt_tools(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The tools the prompt declares: none at all when ``tool_choice`` is ``"none"``.

    (DeepSeek-V4 emits DSML whenever tools are in its prompt, so ``none`` must remove
    them rather than only ignore calls.) Raises ``RequestError`` for a ``tool_choice``
    that needs tools when there are none.
    """
    tools = list(req.tools) if req.tools and req.tool_choice != "none" else None
    if req.tool_choice not in ("auto", "none") and not tools:
        raise RequestError("tool_choice requires at least one tool in 'tools'", param="tool_choice")
    return tools


class PromptRenderer:
    """Renders a :class:`ChatRequest` with one family's chat format (no tokenizer, no engine).

    Used by the pipeline and by the offline ``render`` / ``tokenize`` commands, so
    both produce the same prompt for the same request.
    """

    def __init__(self, family: str, reasoning_effort_profile: str) -> None:
        from deepseek_frontend.formats import attach_request_tools, get_chat_format, place_instructions
        from deepseek_frontend.formats.request import TOOL_REFERENCE_TEMPLATE, normalize_tools

        self.chat_format = get_chat_format(family)
        self.reasoning_effort_profile = reasoning_effort_profile
        self._attach_request_tools = attach_request_tools
        self._place_instructions = place_instructions
        # The 0731 ("official") checkpoints saw tools as DeepSeek's API renders them (normalised);
        # the preview's reference encoder renders them as sent (formats.request.normalize_tools).
        self._normalize_tools = normalize_tools if reasoning_effort_profile == "official" else None
        # A family with a system token usable anywhere (V4.1's <｜System｜>) renders mid-conversation
        # instructions itself; V4 and V3.2 get them as tagged user text (formats.request).
        self._native_system_role = bool(getattr(self.chat_format, "NATIVE_SYSTEM_ROLE", False))
        # How a tool result lists the deferred tools it loads (Anthropic tool_reference blocks).
        self._tool_reference_template: str = getattr(
            self.chat_format, "TOOL_REFERENCE_TEMPLATE", TOOL_REFERENCE_TEMPLATE
        )
        params = inspect.signature(self.chat_format.render_prompt_segments).parameters
        # V3.2's renderer has no effort arguments; decided once here rather than per request.
        self._takes_effort = "reasoning_effort" in params
        #: the family reads images (its renderer reports the image records it wrote: V4.1)
        self.takes_images = "images" in params

    def render(self, req: ChatRequest, images: list[Any] | None = None) -> list[PromptSegment]:
        """The prompt segments of ``req``: request tools attached, thinking mode and effort applied.

        ``images``, when a list, receives the image records (resolved ``ImagePart`` s) in prompt
        order, one per image placeholder segment (families that read images only).
        """
        tools = prompt_tools(req)
        messages = self._place_instructions(list(req.messages), native_system_role=self._native_system_role)
        if tools and self._normalize_tools is not None:
            tools = self._normalize_tools(tools)
        # Always: besides tools and the response format, this writes out (or, without tools,
        # drops) the tool references of tool results.
        messages = self._attach_request_tools(
            messages, tools or [], req.response_format, tool_reference_template=self._tool_reference_template
        )
        thinking_mode = "thinking" if req.thinking else "chat"
        if self.takes_images:
            return self.chat_format.render_prompt_segments(
                messages,
                thinking_mode,
                reasoning_effort=req.reasoning_effort,
                reasoning_effort_profile=self.reasoning_effort_profile,
                images=images,
            )
        if self._takes_effort:
            return self.chat_format.render_prompt_segments(
                messages,
                thinking_mode,
                reasoning_effort=req.reasoning_effort,
                reasoning_effort_profile=self.reasoning_effort_profile,
            )
        return self.chat_format.render_prompt_segments(messages, thinking_mode)
