"""The OpenAI Conversations API (``/v1/conversations``) over the conversation-state store."""
