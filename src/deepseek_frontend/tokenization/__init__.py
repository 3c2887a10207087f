"""Tokenization: cached, injection-safe prompt ids and incremental detokenization.

Public API::

    tok = PromptTokenizer.load(model_path=None)     # None: bundled DeepSeek-V4 tokenizer.json
    ids = tok.encode_segments(segments)             # prompt ids from renderer segments
    det = tok.new_detokenizer(); det.push(ids) -> str; det.flush() -> str

Modules: ``tokenizer`` (the :class:`PromptTokenizer` facade and its injection safety), ``segment_encoding``
(segments -> ids through the caches, and why per-run ids are whole-prompt ids), ``caches`` (run and
prefix caches), ``text_encoding`` (text -> ids without holding the GIL, long runs), ``detokenization``
(ids -> text), ``bundled`` (the bundled tokenizer and the V4.1 stand-in) and ``families`` (which
tokenizer a model family gets).
"""

from deepseek_frontend.tokenization.bundled import (
    V41_STAND_IN_RENAMES,
    bundled_tokenizer_path,
    v41_stand_in_tokenizer_json,
)
from deepseek_frontend.tokenization.caches import (
    CACHE_IDLE_SECONDS,
    PREFIX_CACHE_BYTES,
    PREFIX_CACHE_MAX_ENTRIES,
    PREFIX_KEY_SEGMENTS,
    RUN_CACHE_BYTES,
    RUN_CACHE_MIN_CHARS,
    PrefixCache,
    RunCache,
)
from deepseek_frontend.tokenization.detokenization import IncrementalDetokenizer
from deepseek_frontend.tokenization.families import has_own_tokenizer, load_for_family, load_v41_stand_in
from deepseek_frontend.tokenization.segment_encoding import PendingEncoding, encode_together
from deepseek_frontend.tokenization.text_encoding import LONG_RUN_CHARS, split_long_run
from deepseek_frontend.tokenization.tokenizer import (
    BOS_SPELLING,
    EOS_SPELLING,
    SELF_CHECK_RATE,
    PromptTokenizer,
)

__all__ = [
    "BOS_SPELLING",
    "CACHE_IDLE_SECONDS",
    "EOS_SPELLING",
    "LONG_RUN_CHARS",
    "PREFIX_CACHE_BYTES",
    "PREFIX_CACHE_MAX_ENTRIES",
    "PREFIX_KEY_SEGMENTS",
    "RUN_CACHE_BYTES",
    "RUN_CACHE_MIN_CHARS",
    "SELF_CHECK_RATE",
    "V41_STAND_IN_RENAMES",
    "IncrementalDetokenizer",
    "PendingEncoding",
    "PrefixCache",
    "PromptTokenizer",
    "RunCache",
    "bundled_tokenizer_path",
    "encode_together",
    "has_own_tokenizer",
    "load_for_family",
    "load_v41_stand_in",
    "split_long_run",
    "v41_stand_in_tokenizer_json",
]
