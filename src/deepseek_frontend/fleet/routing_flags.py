"""The ``serve`` flags of the router (one definition, used by ``serve_command`` and ``ServerConfig``)."""

from __future__ import annotations

import argparse

from deepseek_frontend.routing.router import ROUTER_MODES, RouterConfig

__all__ = ["DEFAULT_MIGRATION_LIMIT", "add_pd_arguments", "add_routing_arguments", "router_config_from_args"]

#: times one request may move to another worker after its stream broke
DEFAULT_MIGRATION_LIMIT = 3


def add_routing_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the routing flags on ``parser`` (their own help group)."""
    defaults = RouterConfig()
    group = parser.add_argument_group("routing over several workers (docs/routing.md)")
    group.add_argument(
        "--router-mode",
        choices=ROUTER_MODES,
        default=defaults.mode,
        help="kv: KV-cache aware from the workers' KV events; kv-approx: KV-cache aware from the "
        "router's own decisions; session: sticky per agent session header; least-outstanding; "
        f"round-robin (default: {defaults.mode})",
    )
    group.add_argument(
        "--kv-page-size",
        type=int,
        default=None,
        metavar="TOKENS",
        help="tokens per KV block for routing (default: the page size the workers report, else 256)",
    )
    group.add_argument(
        "--kv-events-endpoint",
        action="append",
        default=[],
        metavar="WORKER[#RANK]=ENDPOINT[;REPLAY]",
        help="the ZMQ KV event endpoint of a worker (e.g. http://10.0.0.5:30000=tcp://10.0.0.5:5557;"
        "tcp://10.0.0.5:5558); with #RANK, where ranks from RANK on publish (port + rank - RANK), for "
        "workers whose ranks run on several nodes; default: read from the worker's /server_info "
        "(kv_events, else kv_events_config); repeatable",
    )
    group.add_argument(
        "--kv-index-max-mb",
        type=float,
        default=defaults.index_bytes_per_worker / (1 << 20),
        metavar="MB",
        help="kv: memory the KV-event index may hold per worker, its DP ranks together; past it the "
        "least recently stored or used leaf blocks are forgotten first "
        f"(default {defaults.index_bytes_per_worker >> 20})",
    )
    group.add_argument(
        "--kv-overlap-weight",
        type=float,
        default=defaults.prefill_weight,
        help="kv cost weight of the prefill blocks left after the cached overlap "
        f"(default {defaults.prefill_weight:g})",
    )
    group.add_argument(
        "--kv-decode-weight",
        type=float,
        default=defaults.decode_weight,
        help="kv cost weight of the blocks already in flight on a worker "
        f"(default {defaults.decode_weight:g})",
    )
    group.add_argument(
        "--router-temperature",
        type=float,
        default=defaults.temperature,
        help="0: always the cheapest worker; > 0: sample softmax(-cost) (default 0)",
    )
    group.add_argument(
        "--session-slack",
        type=int,
        default=defaults.session_slack,
        help="requests in flight a session's worker may have above the least loaded before the session "
        f"moves (default {defaults.session_slack})",
    )
    group.add_argument(
        "--session-tolerance",
        type=float,
        default=defaults.session_tolerance,
        help="kv modes: a session stays on its previous worker while that worker costs at most this "
        f"fraction of the prompt's blocks more than the cheapest (default {defaults.session_tolerance:g})",
    )
    group.add_argument(
        "--kv-approx-ttl",
        type=float,
        default=defaults.approx_ttl_s,
        help=f"kv-approx: seconds a routed prompt is assumed cached (default {defaults.approx_ttl_s:g})",
    )
    group.add_argument(
        "--migration-limit",
        type=int,
        default=DEFAULT_MIGRATION_LIMIT,
        help="times a response whose worker failed mid-stream continues on another worker; 0 disables "
        f"(default {DEFAULT_MIGRATION_LIMIT})",
    )


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The :class:`RouterConfig` the flags describe; raises ``ValueError`` for malformed values."""
    endpoints: dict[str, str] = {}
    for spec in getattr(args, "kv_events_endpoint", []) or []:
        worker, sep, endpoint = spec.rpartition("=")
        if not sep or not worker or not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(
                f"--kv-events-endpoint {spec!r}: expected WORKER_URL[#RANK]=tcp://HOST:PORT[;REPLAY]"
            )
        url, _, rank = worker.partition("#")
        if rank and not rank.isdigit():
            raise ValueError(f"--kv-events-endpoint {spec!r}: #RANK must be a rank number")
        endpoints[url.rstrip("/") + (f"#{rank}" if rank else "")] = endpoint
    page = getattr(args, "kv_page_size", None)
    if page is not None and page < 1:
        raise ValueError("--kv-page-size must be >= 1")
    if getattr(args, "migration_limit", 0) < 0:
        raise ValueError("--migration-limit must be >= 0")
    index_mb = getattr(args, "kv_index_max_mb", None)
    if index_mb is not None and index_mb <= 0:
        raise ValueError("--kv-index-max-mb must be > 0")
    defaults = RouterConfig()
    return RouterConfig(
        mode=getattr(args, "router_mode", defaults.mode),
        page_size=page,
        prefill_weight=getattr(args, "kv_overlap_weight", defaults.prefill_weight),
        decode_weight=getattr(args, "kv_decode_weight", defaults.decode_weight),
        temperature=getattr(args, "router_temperature", defaults.temperature),
        session_slack=getattr(args, "session_slack", defaults.session_slack),
        session_tolerance=getattr(args, "session_tolerance", defaults.session_tolerance),
        approx_ttl_s=getattr(args, "kv_approx_ttl", defaults.approx_ttl_s),
        kv_event_endpoints=endpoints,
        index_bytes_per_worker=int(index_mb * (1 << 20)) if index_mb else defaults.index_bytes_per_worker,
    )


def add_pd_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the prefill/decode disaggregation flags on ``parser`` (disagg/pool.py)."""
    from deepseek_frontend.disagg.pool import TRANSFER_TIMEOUT_S

    group = parser.add_argument_group("prefill/decode disaggregation (docs/routing.md)")
    group.add_argument(
        "--prefill-worker",
        action="append",
        default=[],
        metavar="URL",
        help="a prefill worker (SGLang --disaggregation-mode prefill, or a vLLM KV producer); "
        "dns+http:// as for --worker; repeatable. With --decode-worker, instead of --worker",
    )
    group.add_argument(
        "--decode-worker",
        action="append",
        default=[],
        metavar="URL",
        help="a decode worker (SGLang --disaggregation-mode decode, or a vLLM KV consumer); repeatable",
    )
    group.add_argument(
        "--pd-transfer-timeout",
        type=float,
        default=TRANSFER_TIMEOUT_S,
        metavar="SECONDS",
        help="seconds the KV transfer may take: the decode's first token after the prefill's answer, "
        "or (SGLang, both legs running) either of them after the legs were sent, beyond 0.5 ms of "
        "prefill per prompt token; then both legs are aborted and the client gets a 504 "
        f"(0: no limit; default {TRANSFER_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--vllm-kv-connector",
        choices=("nixl", "mooncake"),
        default="nixl",
        help="the vLLM KV connector of the prefill/decode workers: nixl (NixlConnector: the prefill's "
        "answer carries the decode's kv_transfer_params) or mooncake (MooncakeConnector: the frontend "
        "mints the transfer_id and builds them; docs/routing.md) (default %(default)s)",
    )
    group.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=None,
        metavar="PORT",
        help="the bootstrap port sent to decode workers for every prefill worker (default: the port "
        "each prefill worker reports as disaggregation_bootstrap_port in /server_info, else 8998)",
    )
