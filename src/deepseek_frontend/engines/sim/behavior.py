"""How strict the simulated engine is: the real engines' refusals, as options (pure, no I/O).

By default the simulated engine is kind: it enforces every grammar it plans for, honours seeds,
has no context limit of its own and answers health probes at once. A :class:`SimBehavior` makes
it behave like a real SGLang 0.5.23 worker launched a given way, so the frontend can be tested
against what it will meet:

* ``grammar_backend="none"`` (or ``skip_tokenizer_init``: SGLang then builds no grammar backend)
  -- a request carrying ``json_schema`` / ``regex`` / ``ebnf`` / ``structural_tag`` is finished
  with one abort chunk ``{"type": "abort", "message", "status_code": 400, "err_type":
  "BadRequestError"}`` (SGLang's ``grammar_manager.py``);
* ``context_length`` with EAGLE speculative settings -- SGLang reserves
  ``max(eagle_topk * num_steps, num_draft_tokens)`` output slots and refuses, inside the stream
  (HTTP 200, then ``{"error": {"message", "code": 400, "retryable": false}}``), an input with
  ``input + reserved >= context_length`` or ``input + reserved + max_new_tokens > context_length``;
* ``deterministic_inference=False`` -- ``sampling_seed`` has no effect (SGLang's sampler reads it
  only with ``--enable-deterministic-inference``);
* ``health_delay_s`` -- ``/health`` and ``/health_generate`` take this long (SGLang runs a
  one-token generation and polls for it once a second, up to 20 s under load).

:data:`PRESETS` names the launches worth testing against; ``sglang-recipe`` is the recipe's
original worker (``--skip-tokenizer-init``, EAGLE 3 steps / top-k 1 / 4 draft tokens, no
deterministic inference).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from deepseek_frontend.generation import ConstraintKind, SamplingParams, WorkerCapabilities

__all__ = ["PRESETS", "SimBehavior", "SimRefusal"]

#: constraint kinds the simulated model can plan an answer for (see engine.py)
SIM_CONSTRAINT_KINDS: frozenset[ConstraintKind] = frozenset({"ebnf", "json_schema"})
_EAGLE = frozenset({"EAGLE", "EAGLE3", "NEXTN"})

#: SGLang 0.5.23's message for a grammar request without a grammar backend (grammar_manager.py)
NO_GRAMMAR_MESSAGE = (
    "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the "
    "server is launched with --grammar-backend none"
)


@dataclass(frozen=True, slots=True)
class SimRefusal:
    """A request the simulated worker refuses, and how the refusal travels.

    ``kind`` "abort": one finish chunk with an abort reason carrying ``status_code`` (the scheduler
    refused it); "error": one in-stream error event (the tokenizer manager refused it). Without
    streaming both are an HTTP ``status_code`` answer ``{"error": {"message"}}``.
    """

    kind: Literal["abort", "error"]
    message: str
    status_code: int = 400


@dataclass(frozen=True, slots=True)
class SimBehavior:
    """What the simulated worker refuses and reports (see the module docstring).

    ``context_length`` None: no limit of its own. ``report_context_length`` False leaves
    ``context_length`` out of ``/server_info`` (SGLang reports only a ``--context-length`` flag,
    not the model's own length).
    """

    grammar_backend: str = "xgrammar"
    skip_tokenizer_init: bool = False
    context_length: int | None = None
    report_context_length: bool = True
    speculative_algorithm: str | None = None
    speculative_num_steps: int = 0
    speculative_eagle_topk: int = 0
    speculative_num_draft_tokens: int = 0
    deterministic_inference: bool = True
    health_delay_s: float = 0.0
    #: SGLang's KV page size for DeepSeek-V4 (reported in ``/server_info`` and to discovery)
    page_size: int = 256

    @property
    def has_grammar_backend(self) -> bool:
        """False without a tokenizer or with ``grammar_backend`` "none" (SGLang's GrammarManager)."""
        return not self.skip_tokenizer_init and self.grammar_backend != "none"

    @property
    def reserved_output_tokens(self) -> int:
        """Output slots reserved per request (SGLang's ``compute_num_reserved_tokens``)."""
        if (self.speculative_algorithm or "").upper() not in _EAGLE:
            return 0
        return max(
            self.speculative_eagle_topk * self.speculative_num_steps, self.speculative_num_draft_tokens
        )

    def with_overrides(self, **changes: Any) -> SimBehavior:
        """A copy with the given fields changed; ``None`` values are ignored (unset flags)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def refusal(self, input_tokens: int, sampling: SamplingParams) -> SimRefusal | None:
        """Why SGLang would refuse this request, or None. The length check comes first, as in SGLang
        (the tokenizer manager checks lengths before the scheduler looks at the grammar)."""
        if self.context_length is not None:
            context = self.context_length
            total_in = input_tokens + self.reserved_output_tokens
            if total_in >= context:
                return SimRefusal(
                    "error",
                    f"The input ({total_in} tokens) is longer than the model's context length "
                    f"({context} tokens).",
                )
            if total_in + sampling.max_new_tokens > context:
                return SimRefusal(
                    "error",
                    "Requested token count exceeds the model's maximum context length of "
                    f"{context} tokens. You requested a total of {total_in + sampling.max_new_tokens} "
                    f"tokens: {total_in} tokens from the input messages and {sampling.max_new_tokens} "
                    "tokens for the completion. Please reduce the number of tokens in the input "
                    "messages or the completion to fit within the limit.",
                )
        if sampling.constraint is not None and not self.has_grammar_backend:
            return SimRefusal("abort", NO_GRAMMAR_MESSAGE)
        return None

    def effective_seed(self, seed: int | None) -> int | None:
        """The seed the sampler actually uses: None (the engine's default) unless deterministic."""
        return seed if self.deterministic_inference else None

    def constraint_kinds(self) -> frozenset[ConstraintKind]:
        """Kinds this worker enforces: what the simulated model plans for, when a backend exists."""
        return SIM_CONSTRAINT_KINDS if self.has_grammar_backend else frozenset()

    def server_info(self, *, model_path: str, cumulative: bool) -> dict[str, Any]:
        """``/server_info`` as SGLang 0.5.23 spells these settings (flat resolved server args)."""
        info: dict[str, Any] = {
            "model_path": model_path,
            "tokenizer_path": model_path,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "incremental_streaming_output": not cumulative,
            "grammar_backend": self.grammar_backend,
            "context_length": self.context_length if self.report_context_length else None,
            "speculative_algorithm": self.speculative_algorithm,
            "speculative_num_steps": self.speculative_num_steps or None,
            "speculative_eagle_topk": self.speculative_eagle_topk or None,
            "speculative_num_draft_tokens": self.speculative_num_draft_tokens or None,
            "enable_deterministic_inference": self.deterministic_inference,
            "page_size": self.page_size,
            "kv_events_config": None,
            "version": "0.5.23-sim",
            "simulated": True,
        }
        return info

    def capabilities(self) -> WorkerCapabilities:
        """What the in-process simulated engine reports through ``discover()``."""
        return WorkerCapabilities(
            constraint_kinds=self.constraint_kinds(),
            grammar_backend=self.grammar_backend if self.has_grammar_backend else None,
            context_length=self.context_length if self.report_context_length else None,
            reserved_output_tokens=self.reserved_output_tokens,
            honours_seed=self.deterministic_inference,
            page_size=self.page_size,
        )


_SGLANG_RECIPE_GRAMMAR = SimBehavior(
    grammar_backend="xgrammar",
    context_length=1_048_576,
    report_context_length=False,
    speculative_algorithm="EAGLE",
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
    deterministic_inference=False,
    health_delay_s=1.0,
)
"""The recipe's SGLang worker as it launches now: tokenizer loaded, so xgrammar compiles grammars;
EAGLE 3/1/4 (4 reserved output slots), no --enable-deterministic-inference, /health generating."""

#: named behaviours (``sim-engine --behave NAME``, ``serve --sim-behave NAME``)
PRESETS: dict[str, SimBehavior] = {
    # the kind default: every planned grammar enforced, seeds honoured, no limits, instant health
    "ideal": SimBehavior(),
    # the recipe's original SGLang worker: the same but --skip-tokenizer-init (no grammar backend)
    "sglang-recipe": replace(_SGLANG_RECIPE_GRAMMAR, skip_tokenizer_init=True),
    # the recipe's worker as it launches now
    "sglang-recipe-grammar": _SGLANG_RECIPE_GRAMMAR,
}
