"""What the routing tests share: a worker as a router sees it, a request and random prompts."""

from __future__ import annotations

import random
from dataclasses import dataclass

from deepseek_frontend.generation import GenerateRequest, SamplingParams

#: tokens per KV block in these tests
PAGE = 16


@dataclass
class W:
    """A worker as the router reads it: its URL and requests in flight."""

    url: str
    in_flight: int = 0


def req(prompt: list[int], rid: str = "r") -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_new_tokens=8))


def ids(n: int, seed: int) -> list[int]:
    """``n`` token ids, random but the same for the same ``seed``."""
    rng = random.Random(seed)
    return [rng.randrange(100_000) for _ in range(n)]
