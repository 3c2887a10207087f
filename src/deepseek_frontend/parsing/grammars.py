"""Spellings of each model family's output grammar, as data.

One :class:`DsmlGrammar` per family lists every spelling the parser recognises; the engine in
:mod:`deepseek_frontend.parsing.stream` is shared by all of them. Adding a family is one new table plus one
line in :data:`GRAMMARS`.

Every family also accepts the other families' spellings as aliases (the first name of each tuple is the
family's own): a model fine-tuned across versions sometimes writes a neighbour's block name, and accepting
it costs nothing because no alias is a prefix of another terminal.

The DSML token of the DeepSeek-V4 tokenizer is ``｜DSML｜`` (full-width bars) without the ``<``; the model
writes ``<`` then ``｜DSML｜`` then the tag name in small pieces, so every terminal below starts with ``<``.
ASCII-pipe look-alikes (``<|DSML|...``) are *not* markup: DeepSeek's reference parser keeps them as text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from deepseek_frontend.errors import UnsupportedModelError


class Terminal(enum.IntEnum):
    """The kinds of fixed strings the lexer recognises."""

    THINK_OPEN = 0
    THINK_CLOSE = 1
    EOS = 2
    BLOCK_OPEN = 3
    BLOCK_CLOSE = 4
    #: ``<｜DSML｜invoke`` -- an attribute header (`` name="x">``) follows
    INVOKE_OPEN = 5
    INVOKE_CLOSE = 6
    #: ``<｜DSML｜parameter`` -- an attribute header (`` name="k" string="true">``) follows
    PARAM_OPEN = 7
    PARAM_CLOSE = 8


# Spellings shared by the DeepSeek families. V4.1 puts a space between the DSML token and the tag name
# (sglang's DeepSeekV41Detector notes the space is intentional); a block is read under each family's
# name with or without it, so a model that mixes the two spellings never shows its block as text.
_BLOCK_ALIASES = tuple(
    spaced + name for name in ("tool_calls", "function_calls", "toolcalls", "calls") for spaced in ("", " ")
)
_INVOKE_ALIASES = ("invoke", " invoke")
_PARAMETER_ALIASES = ("parameter", " parameter")


def _own_first(own: str, aliases: tuple[str, ...]) -> tuple[str, ...]:
    return (own, *(a for a in aliases if a != own))


@dataclass(frozen=True)
class DsmlGrammar:
    """The spellings of one family. The first entry of each name tuple is what the family itself writes."""

    family: str
    block_names: tuple[str, ...]
    invoke_names: tuple[str, ...]
    parameter_names: tuple[str, ...]
    dsml: str = "｜DSML｜"
    think_open: str = "<think>"
    think_close: str = "</think>"
    eos: str = "<｜end▁of▁sentence｜>"

    def _opener(self, name: str) -> str:
        """``<｜DSML｜name``: how a tag called ``name`` opens (a block adds ``>``, the others a header)."""
        return f"<{self.dsml}{name}"

    def _closer(self, name: str) -> str:
        """``</｜DSML｜name>``: how a tag called ``name`` closes."""
        return f"</{self.dsml}{name}>"

    def terminals(self) -> dict[str, Terminal]:
        """Every terminal string of the grammar mapped to its kind."""
        table: dict[str, Terminal] = {
            self.think_open: Terminal.THINK_OPEN,
            self.think_close: Terminal.THINK_CLOSE,
            self.eos: Terminal.EOS,
        }
        # (names, what ends the opener terminal, opener kind, closer kind): an invoke or parameter opener
        # is followed by an attribute header the lexer does not match, so its terminal stops at the name
        tags = (
            (self.block_names, ">", Terminal.BLOCK_OPEN, Terminal.BLOCK_CLOSE),
            (self.invoke_names, "", Terminal.INVOKE_OPEN, Terminal.INVOKE_CLOSE),
            (self.parameter_names, "", Terminal.PARAM_OPEN, Terminal.PARAM_CLOSE),
        )
        for names, opener_end, opener_kind, closer_kind in tags:
            for name in names:
                table[self._opener(name) + opener_end] = opener_kind
                table[self._closer(name)] = closer_kind
        return table

    @property
    def block_open(self) -> str:
        """The family's own block opener, e.g. ``<｜DSML｜tool_calls>``."""
        return self._opener(self.block_names[0]) + ">"

    @property
    def block_close(self) -> str:
        return self._closer(self.block_names[0])

    @property
    def invoke_open(self) -> str:
        """The family's own invoke opener without its header, e.g. ``<｜DSML｜invoke``."""
        return self._opener(self.invoke_names[0])

    @property
    def invoke_close(self) -> str:
        return self._closer(self.invoke_names[0])

    @property
    def parameter_open(self) -> str:
        return self._opener(self.parameter_names[0])

    @property
    def parameter_close(self) -> str:
        return self._closer(self.parameter_names[0])


def _deepseek(family: str, block: str, invoke: str = "invoke", parameter: str = "parameter") -> DsmlGrammar:
    """A DeepSeek family that writes ``block``, ``invoke`` and ``parameter`` and reads every alias."""
    return DsmlGrammar(
        family=family,
        block_names=_own_first(block, _BLOCK_ALIASES),
        invoke_names=_own_first(invoke, _INVOKE_ALIASES),
        parameter_names=_own_first(parameter, _PARAMETER_ALIASES),
    )


DEEPSEEK_V4 = _deepseek("deepseek_v4", "tool_calls")
DEEPSEEK_V32 = _deepseek("deepseek_v32", "function_calls")
DEEPSEEK_V41 = _deepseek("deepseek_v41", " calls", " invoke", " parameter")

#: family name -> grammar. The family names are the ones ``formats.detect_family`` reports.
GRAMMARS: dict[str, DsmlGrammar] = {g.family: g for g in (DEEPSEEK_V4, DEEPSEEK_V32, DEEPSEEK_V41)}


def get_grammar(family: str) -> DsmlGrammar:
    """The grammar of ``family``; :class:`UnsupportedModelError` for an unknown family."""
    try:
        return GRAMMARS[family]
    except KeyError:
        known = ", ".join(sorted(GRAMMARS))
        raise UnsupportedModelError(
            f"no output parser for model family {family!r} (known: {known})", param="model"
        ) from None
