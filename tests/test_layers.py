"""Imports inside ``deepseek_frontend`` run down a stack of layers, and never in a circle.

The rule: the package is a stack of layers (:data:`LAYERS`, bottom first). A module may import
modules of its own layer or of a lower one. An import of a higher layer is a back-edge: the lower
layer then depends on everything above it, and no layer can be read, tested or changed without the
ones it was meant to serve. Within a layer modules may import each other, but the module graph has
no cycle: every circle of imports is reported with the line of each import in it.

A lower module must not read a higher one's objects by name either: a parameter annotated ``Any``
(or ``object``) read with ``getattr(param, "name")`` / ``hasattr(param, "name")`` is a dependency
on whatever has that name, hidden from the import graph. Below the entry points such a read is
reported (:func:`name_probes`); name what you read as a ``typing.Protocol`` or pass the value in.

Every import counts -- at module level, inside a function (a lazy import) and under
``if TYPE_CHECKING:`` -- because each is a dependency of the importing module's code, whenever it
runs. Relative imports are resolved against the importing module's package. ``from pkg import
name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``); the
parent packages an import initialises on the way are not edges (a submodule import does not use
its package's re-exports). Every module belongs to exactly one layer, so a new module is placed
deliberately.
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "deepseek_frontend"


@dataclass(frozen=True)
class Layer:
    name: str
    #: dotted module names, fnmatch patterns (``pkg.*`` also matches deeper modules)
    modules: tuple[str, ...]


def _in(package: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{package}{name}" for name in names)


#: bottom first; each layer may import only itself and the layers before it
LAYERS: tuple[Layer, ...] = (
    # what every layer shares: the package's version, the error tree, the request and chunk types
    # that cross from the API to the engines, tracing, asyncio task helpers, file-descriptor setup,
    # random ids
    Layer(
        "foundations",
        _in(PACKAGE, "", ".errors", ".generation", "._tracing", "._tasks", "._descriptors", "._random_ids"),
    ),
    # the DeepSeek chat formats: rendering messages to prompt text and back
    Layer("formats", _in(PACKAGE, ".formats", ".formats.*")),
    # image parts of a request: decoded, measured and counted in tokens, then handed to the V4.1
    # format as its ImagePart
    Layer("images", _in(PACKAGE, ".images")),
    # prompt text to token ids (the formats' special tokens)
    Layer("tokenization", _in(PACKAGE, ".tokenization", ".tokenization.*")),
    # model output to events: reasoning, content, tool calls; decoding constraints for tools
    Layer("parsing", _in(PACKAGE, ".parsing", ".parsing.*")),
    # choosing among workers known by URL and capabilities (KV-cache index, sessions, KV events,
    # migration's continuation request): a routing decision never calls an engine itself
    Layer("routing", _in(PACKAGE, ".routing", ".routing.*")),
    # engine clients (SGLang, vLLM, the simulated engine) and the worker pool that asks a router
    Layer("engines", _in(PACKAGE, ".engines", ".engines.*")),
    # prefill/decode orchestration: two worker pools composed into one engine
    Layer("disagg", _in(PACKAGE, ".disagg", ".disagg.*")),
    # a chat request end to end: render, tokenize, generate, parse
    Layer("pipeline", _in(PACKAGE, ".pipeline", ".pipeline.*")),
    # stored responses and conversations
    Layer("state", _in(PACKAGE, ".state", ".state.*")),
    # API keys: tenants, their limits and the limits' shared state
    Layer("keys", _in(PACKAGE, ".keys", ".keys.*")),
    # what is served: the models, their configuration, admission and metrics
    Layer("fleet", _in(PACKAGE, ".fleet", ".fleet.*")),
    # one request in and out: its context, body, route, limits, tracking, streaming, errors
    Layer("edge", _in(PACKAGE, ".edge", ".edge.*")),
    # the wire protocols: OpenAI chat and completions, Anthropic Messages, Responses, conversations
    Layer("api", _in(PACKAGE, ".api", ".api.*")),
    # the server process: app composition, serve command and flags, supervisor, HTTP protocol, reload
    Layer("server", _in(PACKAGE, ".server", ".server.*")),
    # commands and the command line over everything below
    Layer(
        "entry points",
        _in(PACKAGE, ".commands", ".commands.*", ".e2e", ".e2e.*", ".cli", ".__main__"),
    ),
)


@dataclass(frozen=True, order=True)
class Edge:
    """``importer`` imports ``imported`` at ``line`` of ``path``."""

    importer: str
    line: int
    imported: str
    path: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}"


def modules_under(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``src``."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported_names(tree: ast.Module, package: str) -> Iterable[tuple[int, str, str | None]]:
    """``(line, module, name)`` per imported name, anywhere in the tree (functions and
    ``if TYPE_CHECKING:`` included); relative imports resolved against ``package``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:
                yield node.lineno, module, alias.name


def import_edges(src: Path, package: str) -> list[Edge]:
    """Every import of one of ``package``'s modules by another (see the module docstring)."""
    modules = modules_under(src, package)
    edges = set()
    for importer, path in modules.items():
        own_package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, module, name in _imported_names(tree, own_package):
            target = f"{module}.{name}" if name is not None and f"{module}.{name}" in modules else module
            while target and target not in modules:  # ``import a.b.func``-style: its module
                target = target.rpartition(".")[0]
            if target and target != importer:
                edges.add(Edge(importer, line, target, str(path.relative_to(src))))
    return sorted(edges)


def layer_of(module: str, layers: Sequence[Layer]) -> list[int]:
    """Indexes of the layers whose patterns match ``module`` (exactly one, when well placed)."""
    return [i for i, layer in enumerate(layers) if any(fnmatch.fnmatchcase(module, p) for p in layer.modules)]


def _layer_index(module: str, layers: Sequence[Layer]) -> int:
    hits = layer_of(module, layers)
    assert len(hits) == 1, f"{module} is in {len(hits)} layers, not one: place it in LAYERS"
    return hits[0]


def back_edges(edges: Iterable[Edge], layers: Sequence[Layer]) -> list[str]:
    """The imports that run up a layer, one line each."""
    found = []
    for edge in edges:
        low, high = _layer_index(edge.importer, layers), _layer_index(edge.imported, layers)
        if high > low:
            found.append(f"{edge} (layer {layers[low].name!r} below {layers[high].name!r})")
    return found


def _graph(edges: Iterable[Edge]) -> dict[str, dict[str, Edge]]:
    """importer -> imported -> the import's first line."""
    graph: dict[str, dict[str, Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, {}).setdefault(edge.imported, edge)
    return graph


def circular_groups(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def import_cycles(edges: Iterable[Edge]) -> list[str]:
    """One circle of imports per group of modules that reach each other, with each import's line."""
    graph = _graph(edges)
    cycles = []
    for group in circular_groups(graph):
        members = set(group)
        # the shortest way from the group's first module back to itself, inside the group
        start, paths = group[0], {group[0]: [group[0]]}
        frontier, cycle = [start], None
        while frontier and cycle is None:
            nxt = []
            for node in frontier:
                for succ in sorted(graph.get(node, {})):
                    if succ == start:
                        cycle = [*paths[node], start]
                        break
                    if succ in members and succ not in paths:
                        paths[succ] = [*paths[node], succ]
                        nxt.append(succ)
                if cycle is not None:
                    break
            frontier = nxt
        assert cycle is not None
        cycles.append(" -> ".join(str(graph[a][b]) for a, b in itertools.pairwise(cycle)))
    return cycles


#: the annotations that say nothing of what a parameter is
_UNTYPED = frozenset({"Any", "typing.Any", "object", "Any | None", "object | None"})


def name_probes(src: Path, package: str, layers: Sequence[Layer]) -> list[str]:
    """``getattr`` / ``hasattr`` with a literal name on a parameter annotated ``Any`` or ``object``,
    in modules below the top layer, one line each (see the module docstring)."""
    found = []
    for module, path in modules_under(src, package).items():
        if _layer_index(module, layers) == len(layers) - 1:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            untyped = {
                p.arg for p in params if p.annotation is not None and ast.unparse(p.annotation) in _UNTYPED
            }
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id in untyped
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)
                ):
                    where = f"{path.relative_to(src)}:{node.lineno}"
                    found.append(
                        f"{where}: {fn.name} reads {node.args[0].id}.{node.args[1].value} through Any"
                    )
    return sorted(found)


# ------------------------------------------------------------------------------ the package


def test_every_module_belongs_to_exactly_one_layer() -> None:
    misplaced = {
        module: [LAYERS[i].name for i in hits]
        for module in modules_under(SRC, PACKAGE)
        if len(hits := layer_of(module, LAYERS)) != 1
    }
    assert not misplaced, f"modules in no layer or in several (add them to LAYERS): {misplaced}"


def test_no_import_runs_up_a_layer() -> None:
    found = back_edges(import_edges(SRC, PACKAGE), LAYERS)
    assert not found, "imports of a higher layer:\n" + "\n".join(found)


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = import_cycles(import_edges(SRC, PACKAGE))
    assert not found, "circles of imports:\n" + "\n".join(found)


def test_no_lower_layer_reads_an_untyped_parameter_by_name() -> None:
    found = name_probes(SRC, PACKAGE, LAYERS)
    assert not found, "reads by name through Any (name them as a Protocol):\n" + "\n".join(found)


# ------------------------------------------------------------------------------ the checks themselves


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_relative_lazy_and_type_checking_imports_are_edges(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": "",
            "pkg/low/__init__.py": "from .leaf import x\n",
            "pkg/low/leaf.py": "x = 1\n",
            "pkg/top.py": (
                "from typing import TYPE_CHECKING\n"
                "from . import base\n"
                "from .low import leaf\n"
                "if TYPE_CHECKING:\n"
                "    from pkg.low import x\n"
                "def f():\n"
                "    import pkg.base.something\n"
            ),
        },
    )
    got = {(e.importer, e.line, e.imported) for e in import_edges(tmp_path, "pkg")}
    assert got == {
        ("pkg.low", 1, "pkg.low.leaf"),
        ("pkg.top", 2, "pkg.base"),
        ("pkg.top", 3, "pkg.low.leaf"),
        ("pkg.top", 5, "pkg.low"),
        ("pkg.top", 7, "pkg.base"),
    }


def test_a_back_edge_and_a_circle_are_reported_with_their_lines(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def f():\n    from pkg import high\n",
            "pkg/high.py": "import pkg.low\n",
        },
    )
    edges = import_edges(tmp_path, "pkg")
    layers = (Layer("low", ("pkg", "pkg.low")), Layer("high", ("pkg.high",)))
    assert back_edges(edges, layers) == ["pkg/low.py:2: pkg.low imports pkg.high (layer 'low' below 'high')"]
    assert import_cycles(edges) == [
        "pkg/high.py:1: pkg.high imports pkg.low -> pkg/low.py:2: pkg.low imports pkg.high"
    ]


def test_a_name_read_through_any_is_reported_below_the_top_layer_only(tmp_path: Path) -> None:
    probe = (
        "from typing import Any\n"
        "def f(config: Any, typed: int, bare) -> None:\n"
        "    getattr(config, 'limits', None)\n"
        "    hasattr(typed, 'real')\n"
        "    getattr(bare, 'x')\n"
        "    getattr(config, name)\n"
    )
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": probe, "pkg/top.py": probe})
    layers = (Layer("low", ("pkg", "pkg.low")), Layer("top", ("pkg.top",)))
    assert name_probes(tmp_path, "pkg", layers) == ["pkg/low.py:3: f reads config.limits through Any"]
