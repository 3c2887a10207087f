"""The engine side of a request: what it may ask the workers for, checked against what they reported.

:class:`EnginePlanner` holds the decisions :class:`~.chat.ChatPipeline` makes once a prompt is
known: the context a request must fit (the frontend's or the workers', whichever is smaller),
how many new tokens it gets, whether its text alone proves it too long, whether the workers can
read its images, the decoding constraint its ``tool_choice`` / ``response_format`` need (or
DeepSeek's grammar-less ``tool_choice`` fallback), and the :class:`SamplingParams` sent with it.
Each refusal is a 400 raised before anything reaches a worker.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deepseek_frontend.errors import ContextLengthError, RequestError, UnsupportedFeatureError
from deepseek_frontend.generation import DecodingConstraint, SamplingParams, WorkerCapabilities

from .request import ChatRequest, request_chars

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import Engine
    from deepseek_frontend.formats.segments import PromptSegment
    from deepseek_frontend.tokenization import PromptTokenizer

    from .config import PipelineConfig

log = logging.getLogger("deepseek_frontend.api")

#: Output slots kept free when a request has no max_tokens and the workers did not report their
#: reservation: SGLang's EAGLE reserves max(topk * steps, draft tokens) slots -- 4 in the recipe --
#: and refuses a request that fills the context without leaving them.
UNKNOWN_RESERVATION_MARGIN = 16


def _max_token_chars(tokenizer: PromptTokenizer) -> int | None:
    """Longest vocabulary entry in characters (byte-level entries: one character per byte), or None.

    Added tokens are left out: request text is tokenized with them unrecognised.
    """
    vocab = tokenizer.text.get_vocab(with_added_tokens=False)
    return max(map(len, vocab), default=0) or None


class EnginePlanner:
    """Sizes, constrains and parameterises a request's engine call; refuses what cannot be served."""

    def __init__(
        self, config: PipelineConfig, engine: Engine, eos_token_id: int, max_token_chars: int | None
    ) -> None:
        self.config = config
        self.engine = engine
        self.family = config.family
        self.eos_token_id = eos_token_id
        #: most characters one token can stand for: a lower bound of tokens is chars / this
        self.max_token_chars = max_token_chars
        #: whether the "workers ignore seeds" warning was logged (once per pipeline)
        self._seed_warned = False

    def capabilities(self) -> WorkerCapabilities | None:
        """What the engine workers reported they can serve (None: nothing reported)."""
        return self.engine.capabilities()

    def context_length(self, caps: WorkerCapabilities | None = None) -> int:
        """The context a request must fit: the frontend's ``context_length``, or the workers' when smaller."""
        caps = caps if caps is not None else self.capabilities()
        if caps is not None and caps.context_length:
            return min(self.config.context_length, caps.context_length)
        return self.config.context_length

    def check_length_lower_bound(self, req: ChatRequest) -> None:
        """Raise ``ContextLengthError`` when ``req`` is provably too long, without tokenizing it.

        Every token of the (byte-level BPE) vocabulary stands for at most :attr:`max_token_chars`
        characters, and the prompt contains at least the text of the system and user messages, so
        it has at least ``chars / max_token_chars`` tokens. Only what that bound already puts over
        the context is refused here; everything else is counted exactly when it is prepared.
        """
        per_token = self.max_token_chars
        if not per_token:
            return
        chars = request_chars(req, kept_only=True)
        at_least = -(-chars // per_token)
        context = self.context_length()
        if req.max_tokens is not None and at_least + req.max_tokens > context:
            # the same field the exact check would blame (max_new_tokens)
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"at least {at_least + req.max_tokens} tokens (at least {at_least} in the messages: "
                f"{chars} characters of text; {req.max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        if at_least >= context:
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, your messages "
                f"hold {chars} characters of text, which is at least {at_least} tokens. "
                "Please reduce the length of the messages.",
                param="messages",
            )

    def check_image_support(self, images: Sequence[Any]) -> None:
        """Refuse images up front when the workers said they cannot read them.

        SGLang expands an image placeholder with its multimodal processor, which it loads with the
        tokenizer: a worker launched with ``--skip-tokenizer-init`` (``/server_info``) would refuse the
        request (or worse, run it without the images). The 400 names the first image part.
        """
        caps = self.capabilities()
        if caps is None or caps.extra.get("skip_tokenizer_init") is not True:
            return
        where = getattr(images[0], "extra", {}).get("where") or "messages"
        raise UnsupportedFeatureError(
            f"{where}: the {self.config.engine} engine workers of this server run without their tokenizer "
            "(--skip-tokenizer-init), so they have no image processor and cannot read images",
            param=where,
        )

    def max_new_tokens(self, prompt_tokens: int, requested: int | None, *, param: str) -> int:
        """The engine's ``max_new_tokens`` for a prompt of ``prompt_tokens``; raises ContextLengthError.

        The context is the smaller of the frontend's ``context_length`` and the workers' reported one.
        Workers may reserve output slots on top of ``max_new_tokens`` (SGLang's EAGLE keeps draft
        tokens there) and refuse ``prompt + reserved + max_new_tokens > context``, so: an explicit
        ``max_tokens`` that does not fit with the reservation is a 400 naming ``max_tokens``; without
        one the default is the room left after the reservation -- or after
        :data:`UNKNOWN_RESERVATION_MARGIN` tokens when the workers did not say what they reserve --
        capped by ``default_max_tokens``, so a request without ``max_tokens`` never fails for length.
        """
        caps = self.capabilities()
        context = self.context_length(caps)
        reserved = caps.reserved_output_tokens if caps is not None else 0
        room = context - prompt_tokens - reserved
        if requested is not None:
            if room <= 0 or requested > room:
                held = f", {reserved} reserved by the engine's speculative decoding" if reserved else ""
                raise ContextLengthError(
                    f"This model's maximum context length is {context} tokens. However, you requested "
                    f"{prompt_tokens + requested + reserved} tokens ({prompt_tokens} in the messages, "
                    f"{requested} in the completion{held}). "
                    "Please reduce the length of the messages or completion"
                    + (f" (max_tokens can be at most {room} here)." if room > 0 else "."),
                    param=param,
                )
            return requested
        margin = reserved if caps is not None else UNKNOWN_RESERVATION_MARGIN
        room = context - prompt_tokens - margin
        if room <= 0:
            held = f" and {margin} output slots the engine reserves" if margin else ""
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, your messages resulted "
                f"in {prompt_tokens} tokens{held}. Please reduce the length of the messages.",
                param="messages",
            )
        default = self.config.default_max_tokens
        return min(room, default) if default else room

    def preopened_block(
        self, req: ChatRequest, tools: list[dict[str, Any]] | None
    ) -> tuple[ChatRequest, list[PromptSegment]] | None:
        """DeepSeek's grammar-less ``tool_choice`` fallback, or None when it does not apply.

        ``deepseek-recipe`` renders ``tool_choice`` required without constrained decoding by
        ending the prompt with an opened calls block (``</think>``, a blank line,
        ``<｜DSML｜tool_calls>``, a newline) and parsing the output from inside it; a named tool
        becomes "required" with only that tool in the prompt. It does so in chat mode only
        (thinking mode refuses the choice), and so does this. Used when the workers cannot
        enforce an ``ebnf`` grammar. Returns the request to render (tools narrowed) and the
        segments to append.
        """
        from deepseek_frontend.formats import continues_assistant
        from deepseek_frontend.formats.segments import PromptSegment
        from deepseek_frontend.parsing.constraints import BLOCK_NAMES, resolve_tool_choice

        if not tools or req.tool_choice in ("auto", "none") or self.engine.supports_constraint("ebnf"):
            return None
        if req.thinking or self.family not in BLOCK_NAMES or continues_assistant(list(req.messages)):
            # constraint() explains why this cannot be served (a prefill cannot also open a block)
            return None
        names = [t["function"]["name"] for t in tools]
        allowed = resolve_tool_choice(req.tool_choice, names)
        if len(allowed) < len(names):
            from dataclasses import replace

            kept = [t for t in tools if t["function"]["name"] in allowed]
            req = replace(req, tools=kept)
        opening = [
            PromptSegment("\n\n<"),
            PromptSegment("｜DSML｜", True),
            PromptSegment(f"{BLOCK_NAMES[self.family]}>\n"),
        ]
        return req, opening

    def constraint(
        self, req: ChatRequest, tools: list[dict[str, Any]] | None, *, preopened: bool = False
    ) -> DecodingConstraint | None:
        """The decoding constraint of ``req`` (None: unconstrained), checked against the workers.

        ``tool_choice`` required / named -> a DSML tool-call grammar (unless ``preopened``: the
        prompt opened the calls block instead). ``response_format`` json_schema / json_object
        -> the JSON answer enforced in every mode (thinking: reasoning free up to ``</think>``).
        Raises ``UnsupportedFeatureError`` (400) when the workers cannot enforce it, rather than
        returning prose the client cannot parse.
        """
        from deepseek_frontend.formats import continues_assistant
        from deepseek_frontend.parsing.constraints import (
            build_structured_output_constraint,
            build_tool_call_constraint,
        )

        # a continued assistant message is already past </think>: its output has no reasoning
        thinking = req.thinking and not continues_assistant(list(req.messages))
        constraint: DecodingConstraint | None = None
        what, param = "", ""
        if tools and req.tool_choice not in ("auto", "none") and not preopened:
            constraint = build_tool_call_constraint(self.family, tools, req.tool_choice, thinking=thinking)
            what, param = "tool_choice 'required' or a named tool", "tool_choice"
            if thinking and not self.engine.supports_constraint("ebnf"):
                raise UnsupportedFeatureError(
                    f"{what} in thinking mode needs constrained decoding (ebnf), which the "
                    f"{self.config.engine} engine workers of this server cannot enforce; disable thinking "
                    "to use DeepSeek's grammar-less fallback (the prompt opens the tool-call block)",
                    param=param,
                )
        rf = req.response_format
        if rf is not None and rf.get("type") in ("json_object", "json_schema"):
            if constraint is not None or preopened:
                raise RequestError(
                    "response_format cannot be combined with tool_choice 'required' or a named tool",
                    param="response_format",
                )
            schema = (rf.get("json_schema") or {}).get("schema") if rf["type"] == "json_schema" else None
            if rf["type"] == "json_schema" and not schema:
                schema = {}
            constraint = build_structured_output_constraint(
                schema, thinking=thinking, family=self.family, tools=tools
            )
            what, param = f"response_format {rf['type']!r}", "response_format"
        if constraint is not None and not self.engine.supports_constraint(constraint.kind):
            raise UnsupportedFeatureError(
                f"{what} needs constrained decoding ({constraint.kind}), which the {self.config.engine} "
                "engine workers of this server cannot enforce",
                param=param,
            )
        return constraint

    def sampling(
        self, req: ChatRequest, max_new: int, constraint: DecodingConstraint | None
    ) -> SamplingParams:
        if req.seed is not None and not self._seed_warned:
            caps = self.capabilities()
            if caps is not None and not caps.honours_seed:
                # The seed is still sent (a worker restarted with deterministic inference honours
                # it); the operator learns once why equal seeds give different answers.
                self._seed_warned = True
                log.warning(
                    "requests carry `seed`, but the engine workers ignore it (SGLang: launch them "
                    "with --enable-deterministic-inference for reproducible sampling)"
                )
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty,
            seed=req.seed,
            # With ignore_eos EOS must not be a stop id either: vLLM stops on stop_token_ids
            # whatever ignore_eos says.
            stop_token_ids=() if req.ignore_eos else (self.eos_token_id,),
            constraint=constraint,
            logprobs=req.logprobs,
            top_logprobs=req.top_logprobs,
            ignore_eos=req.ignore_eos,
            min_new_tokens=min(req.min_tokens, max_new),
        )
