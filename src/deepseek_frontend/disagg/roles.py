"""Whether a worker can play the role it was given (``--prefill-worker``, ``--decode-worker``).

What a worker reports decides (disagg/pool.py checks every worker at start -- a problem stops
``serve`` -- and each role's pool vets every later discovery with the same rules):

* SGLang: ``/server_info`` ``disaggregation_mode`` must be the role (``null``, an aggregated worker,
  is refused too);
* vLLM, when its ``/server_info`` says (only with ``VLLM_SERVER_DEV_MODE=1``): its
  ``kv_transfer_config`` ``kv_role`` must fit the role (``kv_producer`` for prefill, ``kv_consumer``
  for decode, ``kv_both`` for either), and its ``kv_connector`` must be one the orchestrator drives
  with the flow ``--vllm-kv-connector`` names: NixlConnector (``nixl``), MooncakeConnector
  (``mooncake``), or MultiConnector (whose answer merges its connectors' params,
  ``multi_connector.py`` ``_aggregate_request_finished``; not checked further). Any other connector
  is refused, naming it.
"""

from __future__ import annotations

from deepseek_frontend.generation import WorkerCapabilities

from .parts import PdConfig, Role

__all__ = ["VLLM_CONNECTORS", "role_problem"]

#: vLLM KV connectors the orchestrator drives, and the ``--vllm-kv-connector`` flow each needs (None:
#: not checked)
VLLM_CONNECTORS: dict[str, str | None] = {
    "NixlConnector": "nixl",
    "MooncakeConnector": "mooncake",
    "MultiConnector": None,
}
_KV_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}


def role_problem(role: Role, url: str, caps: WorkerCapabilities, config: PdConfig) -> str | None:
    """Why worker ``url``, given as ``role``, cannot serve it (one line), or None (see the module
    docstring; a worker that reports nothing is not refused)."""
    mode = caps.extra.get("disaggregation_mode")
    if mode is not None and mode != role:
        return (
            f"{url} was given as --{role}-worker but its /server_info says disaggregation_mode "
            f'"{mode}" (start it with --disaggregation-mode {role})'
        )
    if config.engine != "vllm":
        return None
    connector = caps.extra.get("kv_connector")
    if isinstance(connector, str):
        if connector not in VLLM_CONNECTORS:
            supported = ", ".join(VLLM_CONNECTORS)
            return (
                f"{url} uses vLLM's {connector}, which serve cannot drive as a prefill/decode pair "
                f"(supported: {supported}; docs/routing.md)"
            )
        flow = VLLM_CONNECTORS[connector]
        if flow is not None and flow != config.kv_connector:
            return f"{url} uses vLLM's {connector}: start serve with --vllm-kv-connector {flow}"
    kv_role = caps.extra.get("kv_role")
    if isinstance(kv_role, str) and kv_role not in _KV_ROLES[role]:
        return f'{url} was given as --{role}-worker but its kv_transfer_config says kv_role "{kv_role}"'
    return None
