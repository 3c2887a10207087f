"""What is served: the models, their configuration and everything each one owns.

Layout::

    config.py          ServerConfig: one model's resolved flags, as parts (model, server, engine, router,
                       pd, limits) each handed whole to the component it configures
    config_file.py     --config FILE: several models and their API keys
    routing_flags.py   the router's and prefill/decode's serve flags
    store_config.py    the state store's serve flags
    served_model.py    ServedModel: one model's tokenizer, engine, pipeline, admission, metrics
    registry.py        which model a request's name means (per API key)
    admission.py       per-model admission control: a bounded queue, then 429
    metrics.py         Prometheus metrics per model and per server
"""

from deepseek_frontend.fleet.config import ServerConfig

__all__ = ["ServerConfig"]
