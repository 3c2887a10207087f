"""The requests the serving benchmarks send: coding-agent conversations and unique prompts.

Bodies are JSON templates with two placeholders: ``@MODEL@`` (the served model name) and
:data:`SALT` (16 bytes, replaced per run and per stream so that every run's prompts are new to the
server's caches). Shared by ``bench_fleet.py`` and ``bench_serving.py``.
"""

from __future__ import annotations

import random

import orjson

__all__ = ["SALT", "code", "conversation_bodies", "tools", "unique_prompt_body"]

#: the width of every conversation's salt; the template holds this placeholder
SALT = b"@SALT-PLACEHOLD@"

#: a coding agent's tools: name, what it does, its parameters (name:type, the first required)
_TOOLS = (
    (
        "read_file",
        "Read a file from the workspace; returns numbered lines.",
        "path:string offset:integer limit:integer",
    ),
    ("write_file", "Create or overwrite a file with the given content.", "path:string content:string"),
    (
        "edit_file",
        "Replace one exact string in a file.",
        "path:string old:string new:string replace_all:boolean",
    ),
    ("bash", "Run a shell command in the workspace.", "command:string timeout_s:integer description:string"),
    ("grep", "Search file contents with a regular expression.", "pattern:string path:string glob:string"),
    ("glob", "List files whose path matches a glob pattern.", "pattern:string path:string"),
    ("list_dir", "List a directory's entries with their sizes.", "path:string depth:integer"),
    ("run_tests", "Run the test suite or one module; report failures.", "target:string verbose:boolean"),
    ("git_diff", "Show the working tree's changes against a revision.", "revision:string paths:array"),
    ("web_fetch", "Fetch a URL and return its text content.", "url:string max_chars:integer"),
    ("todo_write", "Replace the task list shown to the user.", "items:array"),
    ("search_code", "Find symbol definitions and references.", "symbol:string kind:string"),
)
#: the identifiers of the pseudo-source in tool results
_WORD_TEXT = (
    "request response stream token model worker router config limit tenant queue cache prefix "
    "prompt render parse encode decode buffer chunk header body status error retry timeout "
    "health metric label value index offset length count batch engine session state store"
)
_WORDS = _WORD_TEXT.split()


def tools() -> list[dict[str, object]]:
    tools = []
    for name, summary, spec_text in _TOOLS:
        params = dict(item.split(":") for item in spec_text.split())
        properties: dict[str, object] = {}
        for pname, ptype in params.items():
            spec: dict[str, object] = {
                "type": ptype,
                "description": f"The {pname.replace('_', ' ')} for {name}. " + summary,
            }
            if ptype == "array":
                spec["items"] = {"type": "string"}
            properties[pname] = spec
        parameters = {"type": "object", "properties": properties, "required": [next(iter(params))]}
        description = summary + " Use it instead of guessing; prefer small, targeted calls. " * 3
        function = {"name": name, "description": description, "parameters": parameters}
        tools.append({"type": "function", "function": function})
    return tools


def code(rng: random.Random, chars: int) -> str:
    """Pseudo-source and command output of about ``chars`` characters."""
    lines: list[str] = []
    size = 0
    while size < chars:
        a, b, c = rng.sample(_WORDS, 3)
        kind = rng.randrange(4)
        if kind == 0:
            line = f"def {a}_{b}(self, {c}: int = {rng.randrange(1000)}) -> {b.title()}:"
        elif kind == 1:
            line = f"    {a}_{c} = self.{b}.get({c!r}, {rng.randrange(100)})  # {a} {b} {c}"
        elif kind == 2:
            line = f"src/{a}/{b}.py:{rng.randrange(1, 900)}: {c} {a} {rng.randrange(10**6):x}"
        else:
            line = f"    return {a}({b}, {c}={rng.random():.4f})"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def conversation_bodies(
    agent: int,
    turns: int,
    min_chars: int,
    max_chars: int,
    tokens: int,
    extra: dict[str, object] | None = None,
) -> list[bytes]:
    """The JSON bodies of one agent's ``turns`` requests (``model`` and the salt left as
    placeholders), the first about ``min_chars`` long and the last about ``max_chars``. Each
    resends the one before it whole, plus the assistant's tool calls and their results since
    (as an agent client resends its conversation every turn); ``extra``: more top-level fields."""
    rng = random.Random(agent)
    salt = SALT.decode()
    system = (
        "You are a coding agent working in a repository. Read before you edit, run the tests "
        "after every change, and report what you did in a few sentences. " * 30
    )
    messages: list[dict[str, object]] = [{"role": "system", "content": system}]
    task = f"[{salt}] Task {agent}: the rate limiter refuses requests it should admit.\n"
    messages.append({"role": "user", "content": task + code(rng, 1500)})
    base = {
        "model": "@MODEL@", "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": tokens, "ignore_eos": True, "thinking": {"type": "disabled"}, "tools": tools(),
        **(extra or {}),
    }  # fmt: skip
    size = len(orjson.dumps({**base, "messages": messages}))
    # the first request's tool results fill it up to min_chars, each later turn adds one step's share
    step = max(1000, (max_chars - min_chars) // max(1, turns - 1))
    names = [tool[0] for tool in _TOOLS]
    bodies: list[bytes] = []
    call = 0
    while len(bodies) < turns:
        target = min_chars if not bodies else size + step
        while size < target:
            name = names[call % len(names)]
            args = orjson.dumps({"path": f"src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}.py"}).decode()
            call_id = f"call_{salt}_{call}"
            function = {"name": name, "arguments": args}
            messages.append(
                {
                    "role": "assistant",
                    "content": f"[{salt}] Step {call}: checking with {name}.",
                    "tool_calls": [{"id": call_id, "type": "function", "function": function}],
                }
            )
            output = code(rng, min(6000, max(400, target - size)))
            output = f"# [{salt}] {name} output, step {call}\n{output}"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            size = len(orjson.dumps({**base, "messages": messages}))
            call += 1
        bodies.append(orjson.dumps({**base, "messages": messages}))
    return bodies


#: ordinary English words (one token each, mostly, with their leading space) for unique prompts
_PROSE = (
    "the a of to and in is it that for on with as was be by this are from at or have an they "
    "which one you were all we her she there been their has would when if will more no out do so "
    "can what up said about other into than its time only could new them man some these then two "
    "first may any like now my such make over our even most me state after also made many did must "
    "before back see through way where get much go well your know should down work year because "
    "come people just each those how too little good very make world still own last us never under "
    "might while something thought both life being off place long between again system program "
    "question during number however without another against school hand turn since point home "
    "result water room fact area money story month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city name "
    "team minute idea kid body information back parent face others level office door health person "
    "art war history party morning reason research girl guy moment air teacher force education"
)
_PROSE_WORDS = _PROSE.split()


def unique_prompt_body(index: int, words: int, tokens: int, extra: dict[str, object] | None = None) -> bytes:
    """One streamed chat request whose single user message is ``words`` ordinary English words
    (about as many tokens), drawn at random (seeded by ``index``) after the salt: with a new salt
    the whole prompt is new to every cache of a frontend (``model`` and the salt placeholders)."""
    rng = random.Random(index)
    text = f"[{SALT.decode()}] Request {index}: " + " ".join(rng.choices(_PROSE_WORDS, k=words))
    body = {
        "model": "@MODEL@", "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
        "thinking": {"type": "disabled"}, **(extra or {}),
    }  # fmt: skip
    return orjson.dumps(body)
