"""Which tokenizer a model family renders with: the checkpoint's own ``tokenizer.json``, the bundled
DeepSeek-V4 one, or for DeepSeek-V4.1 without its own the V4.1 stand-in (:mod:`.bundled`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepseek_frontend.errors import FormatError, UnsupportedModelError
from deepseek_frontend.tokenization.bundled import bundled_tokenizer_path, v41_stand_in_tokenizer_json
from deepseek_frontend.tokenization.tokenizer import PromptTokenizer


def load_v41_stand_in(**kwargs: Any) -> PromptTokenizer:
    """:class:`PromptTokenizer` on the V4.1 stand-in (see :func:`v41_stand_in_tokenizer_json`);
    ``kwargs`` as for :meth:`PromptTokenizer.load`. Its ``source`` names it a stand-in."""
    path = bundled_tokenizer_path()
    text = v41_stand_in_tokenizer_json(path.read_text(encoding="utf-8"))
    return PromptTokenizer(text, source=f"{path} (V4.1 stand-in)", **kwargs)


def has_own_tokenizer(model_path: str | None) -> bool:
    """Whether ``model_path`` is a ``tokenizer.json`` or a checkpoint directory holding one."""
    if model_path is None:
        return False
    path = Path(model_path)
    return path.is_file() or (path / "tokenizer.json").is_file()


def load_for_family(family: str, model_path: str | None, **kwargs: Any) -> PromptTokenizer:
    """The tokenizer a ``family`` checkpoint renders with: the checkpoint's own (``model_path``), else the
    bundled DeepSeek-V4 one, except for DeepSeek-V4.1 without a tokenizer of its own, which gets the V4.1
    stand-in (:func:`load_v41_stand_in`; its ids are the stand-in's, not the checkpoint's). A V4.1 family
    whose own tokenizer lacks V4.1's special tokens raises ``UnsupportedModelError``. ``kwargs`` as for
    :meth:`PromptTokenizer.load`."""
    if family == "deepseek_v41" and not has_own_tokenizer(model_path):
        return load_v41_stand_in(**kwargs)
    tok = PromptTokenizer.load(model_path, **kwargs)
    if family == "deepseek_v41":
        from deepseek_frontend.formats import dsv41

        for spelling in (dsv41.DSV41_SPELLINGS.system, dsv41.IMAGE_TOKEN):
            try:
                tok.token_id(spelling)
            except FormatError:
                raise UnsupportedModelError(
                    f"{tok.source} has no {spelling} token: it is not a DeepSeek-V4.1 tokenizer "
                    "(pass --model-path of the V4.1 checkpoint)"
                ) from None
    return tok
