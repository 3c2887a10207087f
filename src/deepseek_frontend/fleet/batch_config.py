"""The ``serve`` flags of the Files and Batch APIs, and the limits a request's API key gets.

Server-wide (command line only): how large an upload may be (``--max-file-bytes``, a 413 before
the body is read when its length says so), how many batch lines one process runs at once
(``--batch-concurrency``) and how long a runner's lease on its work lasts without renewal
(``--batch-lease-timeout``). Per API key, with the flags as every key's default and a key entry's
``batch_max_lines`` / ``batch_max_bytes`` / ``max_active_batches`` over them: the lines and bytes
of one batch and the batches a key may have unfinished at once (docs/serving.md, "Batches").
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deepseek_frontend.keys.tenants import Tenant

__all__ = ["BatchLimits", "BatchOptions", "add_batch_arguments", "batch_options_from_args"]

#: OpenAI's limits of one batch: 50,000 requests, a 200 MB input file
DEFAULT_MAX_LINES = 50_000
DEFAULT_MAX_BYTES = 200 * 1024 * 1024
DEFAULT_MAX_FILE_BYTES = 200 * 1024 * 1024
DEFAULT_MAX_ACTIVE = 20
#: batch lines one process runs at once: a small share of --max-concurrent-requests, so
#: interactive requests always find room
DEFAULT_CONCURRENCY = 4
DEFAULT_LEASE_S = 30.0


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What one API key's batches may be: lines and input bytes of one batch, batches unfinished."""

    max_lines: int = DEFAULT_MAX_LINES
    max_bytes: int = DEFAULT_MAX_BYTES
    max_active: int = DEFAULT_MAX_ACTIVE


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """The Files and Batch APIs' settings (see the module docstring)."""

    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    limits: BatchLimits = BatchLimits()
    concurrency: int = DEFAULT_CONCURRENCY
    lease_s: float = DEFAULT_LEASE_S

    def limits_for(self, tenant: Tenant | None) -> BatchLimits:
        """The batch limits of ``tenant``'s key: its entry's, else the flags'."""
        if tenant is None:
            return self.limits
        own = tenant.limits
        return BatchLimits(
            max_lines=own.batch_max_lines or self.limits.max_lines,
            max_bytes=own.batch_max_bytes or self.limits.max_bytes,
            max_active=own.max_active_batches or self.limits.max_active,
        )


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``batches`` flag group of ``serve``."""
    group = parser.add_argument_group("files and batches (docs/serving.md, 'Batches')")
    group.add_argument(
        "--max-file-bytes",
        type=int,
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="BYTES",
        help="largest upload to POST /v1/files; a larger one gets a 413 (before its body is read when "
        "it declares its length); the upload is streamed to the state store in chunks, never held "
        "whole (default: %(default)d, 200 MiB)",
    )
    group.add_argument(
        "--batch-max-lines",
        type=int,
        default=DEFAULT_MAX_LINES,
        metavar="N",
        help="requests one batch may hold; an API key's batch_max_lines overrides it (default: %(default)d)",
    )
    group.add_argument(
        "--batch-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="bytes of one batch's input file; an API key's batch_max_bytes overrides it "
        "(default: %(default)d, 200 MiB)",
    )
    group.add_argument(
        "--batch-max-active",
        type=int,
        default=DEFAULT_MAX_ACTIVE,
        metavar="N",
        help="batches one API key may have unfinished at once (validating, in progress, finalizing or "
        "cancelling); an API key's max_active_batches overrides it (default: %(default)d)",
    )
    group.add_argument(
        "--batch-concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="batch lines this process runs at once, at the lowest priority; 0: this process runs no "
        "batch work (other processes or replicas sharing the state store do) (default: %(default)d)",
    )
    group.add_argument(
        "--batch-lease-timeout",
        type=float,
        default=DEFAULT_LEASE_S,
        metavar="SECONDS",
        help="seconds a process's claim on batch work lasts without renewal (renewed every third of "
        "it); the work of a process that died is taken over after this (default: %(default)g)",
    )


def batch_options_from_args(args: argparse.Namespace) -> BatchOptions:
    """The options the parsed flags give (a missing flag keeps its default); ValueError naming a bad one."""
    defaults = BatchOptions()
    get = getattr
    options = BatchOptions(
        max_file_bytes=get(args, "max_file_bytes", defaults.max_file_bytes),
        limits=BatchLimits(
            max_lines=get(args, "batch_max_lines", defaults.limits.max_lines),
            max_bytes=get(args, "batch_max_bytes", defaults.limits.max_bytes),
            max_active=get(args, "batch_max_active", defaults.limits.max_active),
        ),
        concurrency=get(args, "batch_concurrency", defaults.concurrency),
        lease_s=get(args, "batch_lease_timeout", defaults.lease_s),
    )
    for flag, value in (
        ("--max-file-bytes", options.max_file_bytes),
        ("--batch-max-lines", options.limits.max_lines),
        ("--batch-max-bytes", options.limits.max_bytes),
        ("--batch-max-active", options.limits.max_active),
        ("--batch-lease-timeout", options.lease_s),
    ):
        if value is None or value <= 0:
            raise ValueError(f"{flag} must be positive, got {value!r}")
    if options.concurrency is None or options.concurrency < 0:
        raise ValueError(f"--batch-concurrency must be 0 or positive, got {options.concurrency!r}")
    return options
