"""Placeholders that stand for every attribute of a package this CI machine cannot install.

See .ci/sglang-standins/README.md. A module of the stand-in sets
``__getattr__ = module_getattr(__name__)``; then ``module.anything`` (and ``from module import anything``)
is a :class:`Placeholder`, attributes of a placeholder are placeholders again
(``InterpolationMode.BICUBIC``), a class statement may name one as its base, and calling one raises
``NotImplementedError`` with its full name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


class StandInBase:
    """What a class deriving from a placeholder derives from instead."""


class Placeholder:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"{self._name} was called, but this is an import-only stand-in (.ci/sglang-standins): "
            "the real package is not installed on this CPU-only machine"
        )

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (StandInBase,)

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


def module_getattr(module: str) -> Callable[[str], Placeholder]:
    """The module-level ``__getattr__`` (PEP 562) of the stand-in module ``module``."""

    def __getattr__(attr: str) -> Placeholder:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        return Placeholder(f"{module}.{attr}")

    return __getattr__
