"""The OpenAI protocols served from the chat pipeline: ``/v1/chat/completions`` (chat.py) and
``/v1/completions`` (completions.py). The Responses API has its own package, ``api/responses``."""
