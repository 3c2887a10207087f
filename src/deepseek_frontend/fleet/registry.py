"""Which served model a request's ``model`` names: the models of one server and their names.

A name resolves, in this order, to the model it is the served name of, to the model that lists
it as an exact alias, then to the first model (in configuration order) with a glob alias that
matches it (``claude-*``). A name no model answers to -- or one the request's API key may not use
-- is a 404 that lists only the names that key may use, as if the others did not exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from deepseek_frontend.errors import ModelNotFoundError

from .config import unknown_model_error

if TYPE_CHECKING:
    from .served_model import ServedModel


class ModelRegistry:
    """The models one server serves, in configuration order (the first is the default: a request
    without ``model``, and the routes that name none, use it)."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("a server serves at least one model")
        self.models: tuple[ServedModel, ...] = tuple(models)
        self._by_name: dict[str, ServedModel] = {}
        for model in self.models:
            self._by_name.setdefault(model.name, model)
        for model in self.models:
            for alias in model.config.model.model_aliases:
                if not alias.is_glob:
                    self._by_name.setdefault(alias.pattern, model)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def default(self) -> ServedModel:
        """The first model."""
        return self.models[0]

    @property
    def only(self) -> ServedModel | None:
        """The model, when the server serves exactly one."""
        return self.models[0] if len(self.models) == 1 else None

    def get(self, served_name: str) -> ServedModel | None:
        """The model served under ``served_name`` (not an alias), or None."""
        for model in self.models:
            if model.name == served_name:
                return model
        return None

    def find(self, name: str) -> ServedModel | None:
        """The model answering to ``name`` (served name, exact alias, then glob), or None."""
        model = self._by_name.get(name)
        if model is not None:
            return model
        for model in self.models:
            if any(alias.is_glob and alias.matches(name) for alias in model.config.model.model_aliases):
                return model
        return None

    def resolve(self, name: str | None, tenant: Any = None) -> ServedModel:
        """The model a request naming ``name`` goes to (None: the first one ``tenant`` may use).

        Raises ``ModelNotFoundError`` (404) when no model answers to ``name`` or ``tenant`` (a
        ``Tenant`` or None: any model) may not use the one that does.
        """
        if name is None:
            for model in self.models:
                if tenant is None or tenant.may_use(model.name):
                    return model
            raise ModelNotFoundError("this API key may use no model of this server", param="model")
        model = self.find(name)
        if model is not None and (tenant is None or tenant.may_use(model.name)):
            return model
        usable = [m for m in self.models if tenant is None or tenant.may_use(m.name)]
        globs = [g for m in usable for g in m.config.model.glob_aliases()]
        raise unknown_model_error(name, [n for n, _ in self.listed(tenant)], globs)

    def listed(self, tenant: Any = None) -> list[tuple[str, ServedModel]]:
        """The names ``GET /v1/models`` lists, each with its model: per model (in configuration order)
        its served name, then its exact aliases. A glob such as ``claude-*`` is a set of names, not
        one, so it is answered but not listed. Only models ``tenant`` may use."""
        out: list[tuple[str, ServedModel]] = []
        seen: set[str] = set()
        for model in self.models:
            if tenant is not None and not tenant.may_use(model.name):
                continue
            for name in model.config.model.listed_model_names():
                if name not in seen and self._by_name.get(name) is model:
                    seen.add(name)
                    out.append((name, model))
        return out
