"""OpenAI's Responses API (``/v1/responses``) on top of the chat completions path."""
