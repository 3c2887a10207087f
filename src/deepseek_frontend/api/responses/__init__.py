"""The OpenAI Responses API, stateless: request conversion (convert.py), stream events and their
accumulation (events.py), and the ``/v1/responses`` route (routes.py)."""
