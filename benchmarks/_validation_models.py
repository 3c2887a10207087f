"""Typed definitions of the OpenAI chat completions request, for ``bench_validation.py``.

Two equivalent sets: :mod:`msgspec` structs (``ChatCompletionRequest``) and pydantic v2
models (``PydanticChatCompletionRequest``). Both accept what ``api/openai/chat.py``
(``to_chat_request``) accepts for a text-only model and reject what it rejects field by field:

* messages: a non-empty array, a union tagged by ``role`` (system, developer, user,
  assistant, tool); content a string or an array of strings and text parts, themselves a
  union tagged by ``type`` (``text``, ``input_text``, ``output_text``: image parts are
  refused, as a text-only model refuses them); assistant ``tool_calls`` with a non-empty
  function name and ``arguments`` as a JSON string, an object or null;
* tools: function tools with a non-empty name and ``parameters`` an object;
* sampling and length fields with the server's bounds (numbers are never booleans;
  pydantic runs in strict mode, so ``"0.7"`` is no temperature, as for the server);
* ``tool_choice``, ``response_format`` (tagged by ``type``), ``thinking``, ``stop`` (at
  most 16 strings), ``stream_options``.

Unknown fields are ignored, as the server ignores them; the ``Strict...`` variants forbid
them. What a type cannot say is left out, and would still be code after decoding: the
JSON-schema check of ``parameters`` (draft 2020-12), unique tool names, a named
``tool_choice`` naming a declared tool, ``top_logprobs`` needing ``logprobs``,
``stream_options`` needing ``stream``, model aliases, and the mapping onto ``ChatRequest``
(text parts joined, object arguments serialised, missing call ids filled).
:func:`msgspec_to_chat_request` is that remainder for the msgspec structs, so the replacement
can be timed end to end.
"""

import json
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from pydantic import BaseModel, ConfigDict, Field

from deepseek_frontend.api.openai.chat_request import resolve_reasoning_effort
from deepseek_frontend.api.schemas import check_json_schema
from deepseek_frontend.api.validation import check_boolean, check_tool_name
from deepseek_frontend.errors import RequestError
from deepseek_frontend.fleet.config import ServerConfig
from deepseek_frontend.pipeline import ChatRequest

MAX_STOP = 16
MAX_N = 16
MAX_TOP_LOGPROBS = 20

# --------------------------------------------------------------------------- msgspec

NonEmptyStr = Annotated[str, Meta(min_length=1)]


def _bounded(low: float, high: float) -> Any:
    return Annotated[float, Meta(ge=low, le=high)] | None


class TextPart(Struct, tag_field="type", tag="text"):
    text: str


class InputTextPart(Struct, tag_field="type", tag="input_text"):
    text: str


class OutputTextPart(Struct, tag_field="type", tag="output_text"):
    text: str


Content = str | list[str | TextPart | InputTextPart | OutputTextPart]


class FunctionCall(Struct):
    name: NonEmptyStr
    arguments: str | dict[str, Any] | None = "{}"


class ToolCall(Struct):
    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class SystemMessage(Struct, tag_field="role", tag="system"):
    content: Content
    name: str | None = None


class DeveloperMessage(Struct, tag_field="role", tag="developer"):
    content: Content
    name: str | None = None


class UserMessage(Struct, tag_field="role", tag="user"):
    content: Content
    name: str | None = None


class AssistantMessage(Struct, tag_field="role", tag="assistant"):
    content: Content | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool"):
    content: Content | None = None
    tool_call_id: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class FunctionDefinition(Struct):
    name: NonEmptyStr
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Struct):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct):
    type: Literal["function"]
    function: NamedFunction


class TextFormat(Struct, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(Struct, tag_field="type", tag="json_object"):
    pass


class JsonSchemaSpec(Struct):
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class JsonSchemaFormat(Struct, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


class Thinking(Struct):
    type: Literal["enabled", "disabled"]


class StreamOptions(Struct):
    include_usage: bool | None = None


class ChatCompletionRequest(Struct):
    messages: Annotated[list[Message], Meta(min_length=1)]
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    thinking: Thinking | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | int | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: _bounded(0.0, 2.0) = None
    top_p: _bounded(0.0, 1.0) = None
    min_p: _bounded(0.0, 1.0) = None
    presence_penalty: _bounded(-2.0, 2.0) = None
    frequency_penalty: _bounded(-2.0, 2.0) = None
    repetition_penalty: _bounded(0.0, 2.0) = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None
    user: str | None = None


class StrictChatCompletionRequest(ChatCompletionRequest, forbid_unknown_fields=True):
    """The same request, refusing unknown top-level fields."""


def msgspec_decode(body: bytes, strict: bool = False) -> ChatCompletionRequest:
    return msgspec.json.decode(body, type=StrictChatCompletionRequest if strict else ChatCompletionRequest)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n\n".join(part if isinstance(part, str) else part.text for part in content)


def _calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    out = []
    for k, call in enumerate(calls):
        args = call.function.arguments
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        out.append(
            {
                "id": call.id if call.id is not None else f"call_{k}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": args or "{}"},
            }
        )
    return out


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        cls = type(msg)
        if cls is AssistantMessage:
            m: dict[str, Any] = {"role": "assistant", "content": _text(msg.content)}
            if msg.reasoning_content is not None:
                m["reasoning_content"] = msg.reasoning_content
            if msg.tool_calls:
                m["tool_calls"] = _calls(msg.tool_calls)
        elif cls is ToolMessage:
            m = {"role": "tool", "content": _text(msg.content), "tool_call_id": msg.tool_call_id or ""}
        else:
            m = {"role": cls.__struct_config__.tag, "content": _text(msg.content)}
        out.append(m)
    return out


def _tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools or ()):
        fn = tool.function
        if fn.name in seen:
            path = f"tools[{i}].function.name"
            raise RequestError(f"{path}: {fn.name!r} is declared twice", param=path)
        seen.add(fn.name)
        spec: dict[str, Any] = {"name": fn.name}
        if fn.description is not None:
            spec["description"] = fn.description
        if fn.parameters is not None:
            path = f"tools[{i}].function.parameters"
            spec["parameters"] = check_json_schema(fn.parameters, path, object_root=True)
        if fn.strict is not None:
            spec["strict"] = fn.strict
        out.append({"type": "function", "function": spec})
    return out or None


def msgspec_to_chat_request(req: ChatCompletionRequest, config: ServerConfig, request_id: str) -> ChatRequest:
    """What the server would still do after ``msgspec.json.decode``: the cross-field checks and the
    mapping onto ``ChatRequest`` (text-only model)."""
    tools = _tools(req.tools)
    choice: Any = req.tool_choice or "auto"
    if choice == "required" and not tools:
        raise RequestError("tool_choice: 'required' needs at least one tool in 'tools'", param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        choice = check_tool_name(choice.function.name, "tool_choice.function.name", tools)
    kwargs = req.chat_template_kwargs or {}
    if req.thinking is not None:
        thinking = req.thinking.type == "enabled"
    elif "thinking" in kwargs or "enable_thinking" in kwargs:
        key = "thinking" if "thinking" in kwargs else "enable_thinking"
        thinking = check_boolean(kwargs[key], f"chat_template_kwargs.{key}")
    else:
        thinking = config.model.default_thinking and req.reasoning_effort != "none"
    if req.top_logprobs and not req.logprobs:
        raise RequestError("top_logprobs: requires logprobs to be true", param="top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise RequestError("stream_options: only allowed when stream is true", param="stream_options")
    response_format = None
    if isinstance(req.response_format, JsonObjectFormat):
        response_format = {"type": "json_object"}
    elif isinstance(req.response_format, JsonSchemaFormat):
        spec = msgspec.structs.asdict(req.response_format.json_schema)
        if spec["schema"] is not None:
            spec["schema"] = check_json_schema(spec["schema"], "response_format.json_schema.schema")
        response_format = {"type": "json_schema", "json_schema": spec}
    stop = req.stop or ()
    return ChatRequest(
        messages=_messages(req.messages),
        request_id=request_id,
        model=config.model.resolve_model(req.model),
        tools=tools,
        tool_choice=choice,
        thinking=thinking,
        reasoning_effort=(
            resolve_reasoning_effort(req.reasoning_effort, config.model.reasoning_effort_profile)
            if thinking
            else None
        ),
        max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        top_k=req.top_k or -1,
        min_p=req.min_p or 0.0,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None else 1.0,
        stop=(stop,) if isinstance(stop, str) else tuple(s for s in stop if s),
        n=req.n or 1,
        logprobs=bool(req.logprobs),
        top_logprobs=req.top_logprobs or 0,
        response_format=response_format,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        user=req.user,
        requested_model=req.model or None,
        ignore_eos=bool(req.ignore_eos),
        min_tokens=req.min_tokens or 0,
    )


# --------------------------------------------------------------------------- pydantic v2

PNonEmptyStr = Annotated[str, Field(min_length=1)]


def _p_bounded(low: float, high: float) -> Any:
    return Annotated[float, Field(ge=low, le=high)] | None


class _Model(BaseModel):
    model_config = ConfigDict(strict=True)


class PTextPart(_Model):
    type: Literal["text"]
    text: str


class PInputTextPart(_Model):
    type: Literal["input_text"]
    text: str


class POutputTextPart(_Model):
    type: Literal["output_text"]
    text: str


PPart = Annotated[PTextPart | PInputTextPart | POutputTextPart, Field(discriminator="type")]
PContent = str | list[str | PPart]


class PFunctionCall(_Model):
    name: PNonEmptyStr
    arguments: str | dict[str, Any] | None = "{}"


class PToolCall(_Model):
    function: PFunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class PSystemMessage(_Model):
    role: Literal["system"]
    content: PContent
    name: str | None = None


class PDeveloperMessage(_Model):
    role: Literal["developer"]
    content: PContent
    name: str | None = None


class PUserMessage(_Model):
    role: Literal["user"]
    content: PContent
    name: str | None = None


class PAssistantMessage(_Model):
    role: Literal["assistant"]
    content: PContent | None = None
    reasoning_content: str | None = None
    tool_calls: list[PToolCall] | None = None
    name: str | None = None


class PToolMessage(_Model):
    role: Literal["tool"]
    content: PContent | None = None
    tool_call_id: str | None = None


PMessage = Annotated[
    PSystemMessage | PDeveloperMessage | PUserMessage | PAssistantMessage | PToolMessage,
    Field(discriminator="role"),
]


class PFunctionDefinition(_Model):
    name: PNonEmptyStr
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class PTool(_Model):
    function: PFunctionDefinition
    type: Literal["function"] = "function"


class PNamedFunction(_Model):
    name: str


class PNamedToolChoice(_Model):
    type: Literal["function"]
    function: PNamedFunction


class PTextFormat(_Model):
    type: Literal["text"]


class PJsonObjectFormat(_Model):
    type: Literal["json_object"]


class PJsonSchemaSpec(_Model):
    # "schema" shadows a BaseModel attribute: the alias keeps the wire name
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class PJsonSchemaFormat(_Model):
    type: Literal["json_schema"]
    json_schema: PJsonSchemaSpec


class PThinking(_Model):
    type: Literal["enabled", "disabled"]


class PStreamOptions(_Model):
    include_usage: bool | None = None


class PydanticChatCompletionRequest(_Model):
    messages: Annotated[list[PMessage], Field(min_length=1)]
    model: str | None = None
    tools: list[PTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | PNamedToolChoice | None = None
    thinking: PThinking | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | int | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: _p_bounded(0.0, 2.0) = None
    top_p: _p_bounded(0.0, 1.0) = None
    min_p: _p_bounded(0.0, 1.0) = None
    presence_penalty: _p_bounded(-2.0, 2.0) = None
    frequency_penalty: _p_bounded(-2.0, 2.0) = None
    repetition_penalty: _p_bounded(0.0, 2.0) = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    stream: bool | None = None
    stream_options: PStreamOptions | None = None
    response_format: (
        Annotated[PTextFormat | PJsonObjectFormat | PJsonSchemaFormat, Field(discriminator="type")] | None
    ) = None
    user: str | None = None


class StrictPydanticChatCompletionRequest(PydanticChatCompletionRequest):
    """The same request, refusing unknown top-level fields."""

    model_config = ConfigDict(strict=True, extra="forbid")


def pydantic_validate(body: bytes, strict: bool = False) -> PydanticChatCompletionRequest:
    model = StrictPydanticChatCompletionRequest if strict else PydanticChatCompletionRequest
    return model.model_validate_json(body)
