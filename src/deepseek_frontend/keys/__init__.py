"""API keys: tenants, their allowed models and limits, and the limits' state shared across processes.

Layout::

    tenants.py         Tenant, TenantTable: keys (hashed), names, models, limits; the keys file
    rate_limits.py     requests and tokens per minute, concurrency: RateLimiter, headers, usage by key
    limit_state.py     where the limiter's per-tenant state lives: one process, or a shared mmap
"""
