"""Anthropic's Messages API (``/v1/messages``) on top of the chat completions path."""
