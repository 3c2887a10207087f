"""One request in and out: what every API request goes through before and after its handler.

Layout::

    context.py         FrontendState (the server's shared state), get_state, served_model,
                       new_request_id, FrontendApp
    route.py           api_route: request id, body, model, priority, the key's limits, admission, the handler
    priority.py        a request's priority, service tier and deadline (headers, service_tier, its key)
    body.py            reading the body before admission, parsing it as a JSON object
    body_readers.py    BodyReaders: requests whose body is still arriving, bounded per client
    turns.py           which requests take the event loop's turns first (TurnGate, RecentHeads)
    arrivals.py        ArrivalPacer: follow-ups of recent conversations start at once, the rest paced
    auth.py            the API key -> the request's tenant (middleware)
    tracking.py        per-request bookkeeping: counters, the key's charge, the "request done" line
    streaming.py       SSE responses, closed (engine requests aborted) however they end; disconnects
    errors.py, sse.py  error bodies per API shape; SSE framing
    memory.py          giving the memory of large requests back once they are done
    log_once.py        a recurring condition logged once per key
"""
