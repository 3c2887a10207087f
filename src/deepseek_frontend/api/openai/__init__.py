"""The OpenAI protocols served from the chat pipeline: ``/v1/chat/completions`` (chat.py, the
endpoint, over chat_request.py -- the body mapped onto a ChatRequest -- and chat_response.py -- chunks,
the SSE body, the whole response) and ``/v1/completions`` (completions.py). The Responses API has its
own package, ``api/responses``."""
