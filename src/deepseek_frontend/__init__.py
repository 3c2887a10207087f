"""deepseek-frontend: OpenAI and Anthropic APIs for DeepSeek-V4 / V3.2 over token-id engine workers."""

__version__ = "0.1.0"

__all__ = ["__version__"]
