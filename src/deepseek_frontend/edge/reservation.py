"""What a request may use of its API key's tokens per minute, reckoned from its body at admission.

A key with ``tokens_per_minute`` reserves a request's possible tokens when the request is admitted
and settles them against what it used when its generation ends (keys/rate_limits.py). The
reservation is made before the request is prepared: tokenizing first would make a refused request
cost its whole preparation (render, tokenize, images), and refusing is what a key past its limit
gets most. So the prompt is estimated from the body, as OpenAI's limiter does:

* :func:`estimate_prompt_tokens`: one token per :data:`CHARS_PER_TOKEN` characters of the body's
  text (every string value: messages, system, tools and their schemas), one per integer of a list
  (a ``/v1/completions`` prompt of token ids); inline images and files (``data:`` URLs, base64
  ``data`` fields) are not estimated -- their tokens, like a stored conversation's, are counted
  when the request is settled;
* :func:`output_allowance`: the output the request may generate -- its ``max_tokens`` (or the
  endpoint's field), else the endpoint's own default, else the model's ``--default-max-tokens``,
  else the room its context leaves -- times its choices.

The estimate is settled when the request ends: unused tokens go back, an underestimate is taken
then. Each generating endpoint passes ``reserve=`` to ``api_route`` (edge/route.py): a function of
the parsed body and the model's configuration, built from these two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from deepseek_frontend.fleet.config import ModelConfig

__all__ = ["CHARS_PER_TOKEN", "Reserve", "choices", "estimate_prompt_tokens", "output_allowance"]

#: characters of text per estimated prompt token (DeepSeek's tokenizer: about 4 for English, fewer
#: for code and CJK text -- an underestimate is taken when the request is settled)
CHARS_PER_TOKEN = 4

#: a route's reservation: the parsed body and the model it goes to -> the tokens it may use
Reserve = Callable[[Mapping[str, Any], ModelConfig], int]


def estimate_prompt_tokens(body: object) -> int:
    """The prompt tokens ``body`` (a parsed JSON request) is estimated to make (module docstring)."""
    chars = ids = 0
    stack: list[object] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if not value.startswith("data:"):  # an inline image or file: counted when settled
                chars += len(value)
        elif isinstance(value, dict):
            inline = value.get("type") == "base64"  # Anthropic's image and document sources
            stack.extend(item for key, item in value.items() if not (inline and key == "data"))
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, int) and not isinstance(item, bool):
                    ids += 1
                else:
                    stack.append(item)
    return math.ceil(chars / CHARS_PER_TOKEN) + ids


def output_allowance(
    model: ModelConfig, prompt_tokens: int, requested: object, *, unset: int | None = None
) -> int:
    """The output one choice may generate: ``requested`` (the body's limit field) when it is a
    positive integer; absent (None), ``unset`` (the endpoint's own default) or the model's
    ``default_max_tokens`` or the context's room after the prompt; 0 for an invalid value (the
    handler refuses the request with a 400 naming the field, and the reservation comes back)."""
    if requested is None:
        if unset is not None:
            return unset
        if model.default_max_tokens:
            return model.default_max_tokens
        return max(0, model.context_length - prompt_tokens)
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        return 0
    return requested


def choices(*counts: object) -> int:
    """The most of ``counts`` (``n``, ``best_of``) that is a positive integer, else 1."""
    valid = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 1]
    return max(valid, default=1)
