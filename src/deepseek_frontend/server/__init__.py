"""The server process: composing the app, the ``serve`` command and its flags, the ``--workers``
supervisor, the listening socket and HTTP protocol, the routes that describe the server, reload
and logs.

Layout::

    app.py             create_app(config) -> Starlette: routes, middlewares, lifespan
    compose.py         the composition root: which tokenizer, engine, router and pipeline settings a
                       configuration means, each built from its part of the config; the served models
    serve_command.py   `deepseek-frontend serve`: run() (binding, processes, the app, uvicorn)
    serve_flags.py     the serve flags' one definition (add_arguments, flag_actions)
    processes.py       --workers N: the supervisor, the children and the cross-process /metrics
    acceptor.py        the listening socket, accepted in bulk (FrontendServer)
    http_protocol.py   the HTTP/1.1 connection: header deadline, connection limit, GET /live in the
                       connection, warm requests first
    info_routes.py     /v1/models, /health, /live, /metrics (per model)
    reload.py          SIGHUP: the configuration swapped in without dropping a request; SIGHUPs
                       during a reload coalesced into one more
    hangups.py         SIGHUPs counted before the event loop listens (instead of dying of them)
    logs.py            key=value or JSON log lines
"""

from deepseek_frontend.server.app import create_app

__all__ = ["create_app"]
