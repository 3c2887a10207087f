"""Continuing the simulated model's own output (what makes mid-stream migration testable).

A real model is autoregressive: given its prompt plus the first ``k`` tokens it wrote, greedy
decoding writes the same remaining tokens. The simulated model plans a whole answer from the
prompt instead, so a migrated request -- the original prompt followed by the output so far --
would get a fresh answer. :func:`split_continuation` recognises such a prompt: the ids after the
last ``<｜Assistant｜>`` turn opener and its thinking tag are output the engine itself would have
written for the prompt that ends there. The engine then continues that plan instead of planning
anew (pure: the caller supplies the planner).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["split_continuation"]


def split_continuation(
    ids: Sequence[int],
    assistant_id: int | None,
    plan: Callable[[Sequence[int]], list[int]],
    last: int | None = None,
) -> tuple[int, list[int]] | None:
    """``(tokens already written, full plan)`` when ``ids`` = a prompt + a prefix of its own plan.

    A plain prompt ends with the assistant opener and one thinking tag; only a longer tail is
    tried (one extra plan for prompts that prefill the assistant turn, which then fail the
    check and are planned as usual). Returns None when ``ids`` is not a continuation.

    ``last``: the index of the last ``assistant_id`` in ``ids`` (-1: there is none), when the
    caller has found it faster than a scan of the list.
    """
    if assistant_id is None:
        return None
    if last is None:
        try:
            last = len(ids) - 1 - list(reversed(ids)).index(assistant_id)
        except ValueError:
            return None
    if last < 0:
        return None
    split = last + 2  # after the opener and its <think> / </think> tag
    written = len(ids) - split
    if written < 1:
        return None
    full = plan(ids[:split])
    if len(full) > written and list(ids[split:]) == full[:written]:
        return written, full
    return None
