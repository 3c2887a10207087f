"""Growing a server's file-descriptor table once at startup, not during its first burst.

The kernel keeps each process's open files in a table that starts at 64 slots and doubles when a
new descriptor does not fit. In a process with more than one thread, every doubling waits for an
RCU grace period (``expand_fdtable`` calls ``synchronize_rcu``): milliseconds each, inside the
``accept()`` that needed the slot, with the event loop stopped. ``serve`` has threads (the
offload pool, the tokenizer's), so its first burst of 256 connections grew the table three times
(64 -> 512) and the last arrival's first chunk took 23-27 ms against 9-14 ms in every later
burst (docs/performance.md, "Burst: a cached-prefix follow-up among 256 arrivals"). The
table never shrinks, so growing it once, at startup, takes that stall out of every burst.
"""

from __future__ import annotations

import contextlib
import logging
import os

__all__ = ["open_files_limit", "reserve_descriptor_table"]

log = logging.getLogger("deepseek_frontend")


def open_files_limit() -> int | None:
    """The open-files limit after raising the soft limit to the hard one (None: unlimited or
    unknown). A server with thousands of connections needs more than the usual soft 1,024."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return None
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return None if soft == resource.RLIM_INFINITY else soft


def reserve_descriptor_table(descriptors: int) -> int:
    """Make the kernel's table of this process's open files hold ``descriptors`` entries now (at
    most the open-files limit allows); returns the highest descriptor number it now fits, or -1
    when it could not be grown (a platform without ``dup2`` to a chosen number, or no limit room).

    Opens nothing that stays open: one descriptor is duplicated onto the highest number wanted and
    closed at once; only the table's size remains.
    """
    highest = descriptors - 1
    limit = open_files_limit()
    if limit is not None:
        highest = min(highest, limit - 1)
    if highest < 64:
        return -1
    try:
        os.fstat(highest)
    except OSError:
        pass  # free, as expected
    else:
        return highest  # in use (dup2 would close it): the table holds that number already
    try:
        source = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return -1
    try:
        os.dup2(source, highest, inheritable=False)
        os.close(highest)
    except OSError as exc:
        log.debug("could not reserve %d file descriptors: %s", descriptors, exc)
        return -1
    finally:
        os.close(source)
    return highest
