"""Offline commands: ``render`` and ``tokenize`` an OpenAI chat request body without a server."""
