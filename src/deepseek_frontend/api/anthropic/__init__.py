"""The Anthropic Messages API: request conversion (convert.py), stream events and their
accumulation (events.py), and the ``/v1/messages`` routes (routes.py)."""
