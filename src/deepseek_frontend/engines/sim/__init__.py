"""The simulated engine: a development and load-testing stand-in for SGLang and vLLM workers.

::

    engine.py    SimulatedEngine: an in-process EngineClient with a prefix cache and fault hooks
    model.py     the "model": deterministic DSV4 output from the prompt by documented rules
    server.py    the engine behind SGLang's HTTP protocol (/generate, /abort_request, /health, ...)
    prompts.py   a /generate body's ids parsed, packed and page-hashed once per shared prefix
    behavior.py  what real engines refuse and report, per preset
    kv.py        the KV cache model (per DP rank, SWA) and its events; resume.py: continuing its own output
    kv_publish.py  SGLang's KV event publishers, one per DP rank
    clock.py     the decode-step clock, held by prefill chunks (prefill interference)
    scheduler.py the running batch and waiting queue, and SGLang's priority scheduling over them
    disagg.py    PD rooms: a prefill worker's bootstrap port, a decode worker's KV fetch
    pd_roles.py  /generate on a prefill or decode worker, as SGLang's PD mode answers it
    command.py   ``deepseek-frontend sim-engine``
"""

from deepseek_frontend.engines.sim.engine import (
    PrefixCache,
    SimStats,
    SimTokenizer,
    SimulatedEngine,
    load_sim_tokenizer,
)

__all__ = ["PrefixCache", "SimStats", "SimTokenizer", "SimulatedEngine", "load_sim_tokenizer"]
