"""Turning a :class:`ChatRequest` into a :class:`PreparedRequest`: render, tokenize, check, size.

:class:`PromptPreparer` renders a request (:class:`~.render.PromptRenderer`), resolves what the
prompt caches already hold of its ids, tokenizes the rest (a :class:`_Draft` carries the request
between those steps), and hands the ids to :class:`~.planning.EnginePlanner` for the length
checks, the decoding constraint and the sampling parameters. It also decides where that work
runs: short prompts on the event loop in their turn (:class:`~.offload.LoopTurns`), long ones on
the offload threads, so one large prompt never stalls every other stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deepseek_frontend import _tracing
from deepseek_frontend.errors import FrontendError, RequestError
from deepseek_frontend.tokenization import encode_together

from .offload import CURRENT_TURN, LoopTurns, OffloadPool, release_current_turn
from .render import prompt_tools
from .request import ChatRequest, PreparedRequest, request_chars

if TYPE_CHECKING:
    from deepseek_frontend.tokenization import PendingEncoding, PromptTokenizer

    from .config import PipelineConfig
    from .interfaces import PipelineMetrics
    from .planning import EnginePlanner
    from .render import PromptRenderer

log = logging.getLogger("deepseek_frontend.api")

#: requests preparing on the event loop at once (see ``LoopTurns``): each step is short (long
#: prompts go to the offload threads), so a loop iteration runs at most a few milliseconds of
#: them, while a burst advances this many requests per iteration instead of one. Measured
#: (benchmarks/bench_serving.py, 1,024 streams starting at once, two processes): 24 starts them
#: twice as fast as 8 (first chunk p99 1.1-1.5 s against 2.4-2.5 s), and a 5,000-request burst
#: still leaves /live under its 100 ms p95 (tests/reliability/test_burst.py); 48 was a little
#: faster again (0.9-1.0 s) but failed that /live bound once in two runs
LOOP_TURN_SLOTS = 24


class _Draft:
    """A request rendered, its cached ids resolved, the rest of its tokenizing maybe still to do
    (:meth:`PromptPreparer._draft`); ``encode`` may run on an offload thread."""

    __slots__ = ("continues", "encoding", "images", "preopened", "request", "seconds", "tools")

    def __init__(
        self,
        request: ChatRequest,
        tools: list[dict[str, Any]] | None,
        continues: bool,
        preopened: Any,
        images: list[Any],
        encoding: PendingEncoding,
    ) -> None:
        self.request = request
        self.tools = tools
        self.continues = continues
        self.preopened = preopened
        self.images = images
        self.encoding = encoding
        #: seconds spent rendering and looking up (the tokenizing's own are ``encoding.seconds``)
        self.seconds = 0.0

    def encode(self) -> None:
        self.encoding.encode()


def _image_handoff(images: Sequence[Any]) -> tuple[tuple[str, ...], int]:
    """``(data URLs, extra tokens)`` of the image records a render reported, in prompt order.

    The prompt holds one placeholder id per image and the engine expands it (SGLang, vLLM): the
    extra tokens are ``tokens - 1`` per image, from the count the API layer's image resolver put
    on each record (``extra["tokens"]``, see ``images.py``). A record the resolver did not
    see is a bug in an adapter, not the client's fault: an internal error.
    """
    if not images:
        return (), 0
    urls: list[str] = []
    extra = 0
    for image in images:
        url = getattr(image, "url", None)
        tokens = getattr(image, "extra", {}).get("tokens")
        if not isinstance(url, str) or not isinstance(tokens, int):
            raise FrontendError("an image part reached the renderer without being resolved")
        urls.append(url)
        extra += tokens - 1
    return tuple(urls), extra


class PromptPreparer:
    """Prepares requests for the engine, keeping the costly parts of long prompts off the event loop."""

    def __init__(
        self,
        config: PipelineConfig,
        tokenizer: PromptTokenizer,
        renderer: PromptRenderer,
        planner: EnginePlanner,
        metrics: PipelineMetrics | None,
        offload: OffloadPool,
        turns: LoopTurns,
    ) -> None:
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.planner = planner
        self.metrics = metrics
        self.offload = offload
        self.turns = turns
        self.offload_min_chars = config.offload_min_chars
        self.offload_prepare_chars = config.offload_prepare_chars
        #: whether prepared requests carry their ids as the tokenizer's ``array("i")``: the
        #: in-process simulated engine reads its bytes as they are; a worker's JSON wants a list
        self.ids_as_array = config.engine == "sim"
        #: tokenizer self-checks running on the offload threads (held so they are not collected)
        self._self_checks: set[asyncio.Task[None]] = set()

    def prepare(self, req: ChatRequest) -> PreparedRequest:
        """Render, tokenize and check ``req``; build the engine's sampling parameters.

        Raises ``FormatError`` (messages the format cannot render),
        ``ContextLengthError``, ``RequestError`` (bad tool_choice / response_format)
        and ``UnsupportedFeatureError`` (a constraint the engine cannot enforce).
        """
        draft = self._draft(req)
        draft.encode()
        return self._complete(draft)

    def count_prompt_tokens(self, req: ChatRequest) -> int:
        """Tokens of the prompt ``prepare`` would send (image placeholders expanded), without
        context-length or engine checks."""
        draft = self._draft(req, for_count=True)
        draft.encode()
        return self._count(draft)

    def _count(self, draft: _Draft) -> int:
        """Prompt tokens of an encoded draft, each image counted at its expanded size."""
        return len(self._finish(draft)) + _image_handoff(draft.images)[1]

    def _finish(self, draft: _Draft) -> array:
        """The draft's prompt ids (``finish_encoding``). On the event loop, the tokenizer's sampled
        self-check -- a whole-prompt encode, 36 ms for 12K tokens and 0.2-0.3 s for 48K, once in
        512 prompts -- goes to the offload threads instead of stalling every stream."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # on an offload thread (a prompt prepared whole there) or a sync caller
            loop = None
        encoding = draft.encoding
        ids = self.tokenizer.finish_encoding(encoding, defer_self_check=loop is not None)
        if loop is not None and encoding.self_check_due:
            # the array is never mutated: the check reads it as the engine does
            check = self.offload.run(self.tokenizer.self_check, encoding.segments, ids)
            task = loop.create_task(check)
            self._self_checks.add(task)
            task.add_done_callback(self._self_check_done)
        return ids

    def _self_check_done(self, task: asyncio.Task[None]) -> None:
        self._self_checks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("the tokenizer self-check failed: %r", task.exception())

    def _draft(self, req: ChatRequest, *, for_count: bool = False) -> _Draft:
        """Render ``req`` and resolve what the prompt caches know of its ids (no tokenizing)."""
        from deepseek_frontend.formats import continues_assistant

        started = time.perf_counter()
        tools = prompt_tools(req)
        preopened = None if for_count else self.planner.preopened_block(req, tools)
        images: list[Any] = []
        with _tracing.phase("render"):
            if preopened is None:
                segments = self.renderer.render(req, images)
            else:
                render_req, opening = preopened
                segments = [*self.renderer.render(render_req, images), *opening]
        # a prompt over the context is refused later: it must not fill the caches on its way
        encoding = self.tokenizer.start_encoding(
            segments, cache_limit=None if for_count else self.planner.context_length()
        )
        draft = _Draft(req, tools, continues_assistant(list(req.messages)), preopened, images, encoding)
        draft.seconds = time.perf_counter() - started
        return draft

    def _complete(self, draft: _Draft) -> PreparedRequest:
        """The :class:`PreparedRequest` of an encoded draft: ids, length checks, sampling."""
        req, tools, preopened, images = draft.request, draft.tools, draft.preopened, draft.images
        started = time.perf_counter()
        ids = self._finish(draft)
        # the in-process engine reads the compact array as it is; a worker's JSON wants a list
        input_ids: Sequence[int] = ids if self.ids_as_array else ids.tolist()
        if self.metrics is not None:
            seconds = draft.seconds + draft.encoding.seconds + time.perf_counter() - started
            self.metrics.tokenization.observe(seconds)

        handoff, extra = _image_handoff(images)
        if handoff:
            self.planner.check_image_support(images)
        max_new = self.planner.max_new_tokens(len(input_ids) + extra, req.max_tokens, param="max_tokens")
        constraint = self.planner.constraint(req, tools, preopened=preopened is not None)
        sampling = self.planner.sampling(req, max_new, constraint)
        return PreparedRequest(
            request=req,
            input_ids=input_ids,
            sampling=sampling,
            tools=tools,
            continues_assistant=draft.continues,
            opened_block="".join(seg[0] for seg in preopened[1]).lstrip("\n") if preopened else "",
            images=handoff,
            image_extra_tokens=extra,
        )

    # -- isolation: long prompts off the event loop ---------------------------------

    async def prepare_async(self, req: ChatRequest) -> PreparedRequest:
        """:meth:`prepare`, with its costly parts off the event loop.

        A request whose text alone proves it longer than the context is refused first, before
        any rendering or tokenization (:meth:`.EnginePlanner.check_length_lower_bound`). A request
        of ``offload_prepare_chars`` or more is prepared wholly on the offload threads. Any other is
        rendered and looked up in the prompt caches on the loop, in its turn (for a follow-up of
        a cached conversation that is all the work there is, so it never waits behind the cold
        prompts of others); only when ``offload_min_chars`` or more of its text are not cached
        does the tokenizing of that text go to the threads.
        """
        self.planner.check_length_lower_bound(req)
        draft = await self._draft_async(req, for_count=False)
        if isinstance(draft, _Draft):
            return self._complete(draft)
        assert isinstance(draft, PreparedRequest)  # prepared whole on a thread
        return draft

    async def count_prompt_tokens_async(self, req: ChatRequest) -> int:
        """:meth:`count_prompt_tokens`, its costly parts off the event loop (as :meth:`prepare_async`)."""
        draft = await self._draft_async(req, for_count=True)
        if isinstance(draft, _Draft):
            return self._count(draft)
        assert isinstance(draft, int)  # counted whole on a thread
        return draft

    async def _draft_async(self, req: ChatRequest, *, for_count: bool) -> _Draft | PreparedRequest | int:
        """An encoded draft of ``req``, or, for a request too long to render on the loop, the whole
        result of :meth:`prepare` / :meth:`count_prompt_tokens` computed on a thread."""
        if request_chars(req) >= self.offload_prepare_chars:
            release_current_turn()  # the loop is free for others while a thread does the work
            with _tracing.phase("render", {"deepseek.offloaded": True, "deepseek.with_tokenize": True}):
                return await self.offload.run(self.count_prompt_tokens if for_count else self.prepare, req)
        token = None
        if CURRENT_TURN.get() is None:  # callers outside the API layer: take a turn here
            token = CURRENT_TURN.set(await self.turns.take())
        try:
            draft = self._draft(req, for_count=for_count)
            uncached = draft.encoding.uncached_chars
            with _tracing.phase("tokenize", {"deepseek.uncached_chars": uncached}):
                if uncached >= self.offload_min_chars:
                    release_current_turn()
                    # with the cold text of every other request queued by then, in one call
                    await self.offload.run_batched(encode_together, draft.encoding, uncached)
                else:
                    draft.encode()
            return draft
        finally:
            if token is not None:
                release_current_turn()
                CURRENT_TURN.reset(token)

    def prepare_raw(self, req: ChatRequest, input_ids: list[int]) -> PreparedRequest:
        """A /v1/completions request: ``input_ids`` go to the engine as they are, output is not parsed.

        ``req.messages`` is ignored; sampling fields, stop strings, n and logprobs apply.
        """
        if not input_ids:
            raise RequestError("prompt is empty", param="prompt")
        vocab = self.tokenizer.vocab_size
        for i, tid in enumerate(input_ids):
            if not 0 <= tid < vocab:
                raise RequestError(
                    f"token id {tid} is outside the vocabulary (0..{vocab - 1})", param=f"prompt[{i}]"
                )
        max_new = self.planner.max_new_tokens(len(input_ids), req.max_tokens, param="max_tokens")
        sampling = self.planner.sampling(req, max_new, None)
        return PreparedRequest(request=req, input_ids=input_ids, sampling=sampling, tools=None, parse=False)
