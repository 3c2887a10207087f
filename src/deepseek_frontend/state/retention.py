"""The background purge: expired and over-budget objects leave the store while the server runs."""

from __future__ import annotations

import asyncio
import logging

from .store import StateStore

__all__ = ["purge_forever"]

log = logging.getLogger("deepseek_frontend.state")


async def purge_forever(store: StateStore) -> None:
    """Purge ``store`` every ``retention.purge_interval_s`` seconds until cancelled. A failed
    purge (the database briefly unreachable) is logged and tried again at the next interval."""
    while True:
        await asyncio.sleep(store.retention.purge_interval_s)
        try:
            removed = await store.purge()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("state store purge failed; retrying in %.0f s", store.retention.purge_interval_s)
            continue
        if removed:
            log.info("state store purge removed %d expired or over-budget objects", removed)
