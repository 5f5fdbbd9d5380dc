"""An Anthropic Messages request as chat fields, and chat blocks as content blocks.

A user turn's ``tool_result`` blocks become ``tool`` messages (before the turn's
text), an assistant turn's ``tool_use`` blocks its tool calls; ``thinking`` blocks of
earlier turns are left out of the prompt (chat templates drop earlier thinking too).
"""

from __future__ import annotations

import json
from typing import Any

from minivllm.entrypoints.openai.anthropic.protocol import (
    AnthropicMessage,
    AnthropicToolChoice,
    MessagesInput,
    StopReason,
)
from minivllm.entrypoints.openai.chat_bridge import Block, Finish
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError

BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
"""The content block types this server reads."""
_SKIPPED = ("thinking", "redacted_thinking")


def _bad(message: str, param: str) -> OpenAIServingError:
    return OpenAIServingError(message, param=param)


def _text(blocks: str | list[Any], where: str) -> str:
    """The text of a string or a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _bad(f"{where}.{i}: only text blocks are supported here, got {kind!r}", where)
        texts.append(block["text"])
    return "\n".join(texts)


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _bad(f"{where}: a tool_use block needs a string id and name", where)
    arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": arguments}}  # fmt: skip


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}: a tool_result block needs a string tool_use_id", where)
    content = _text(block.get("content") or "", f"{where}.content")
    if block.get("is_error"):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _turn(message: AnthropicMessage, where: str) -> list[dict[str, Any]]:
    """The chat messages of one turn."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, block in enumerate(message.content):
        at = f"{where}.content.{i}"
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and message.role == "assistant":
            calls.append(_tool_call(block, at))
        elif kind == "tool_result" and message.role == "user":
            results.append(_tool_result(block, at))
        elif kind not in _SKIPPED:
            raise _bad(
                f"{at}: content block type {kind!r} is not supported in a {message.role} "
                f"message; this server reads {', '.join(BLOCK_TYPES)} blocks",
                at,
            )
    turn: dict[str, Any] = {"role": message.role, "content": "\n".join(texts) or None}
    if calls:
        turn["tool_calls"] = calls
    return [*results, turn] if texts or calls or not results else results


def chat_messages(request: MessagesInput) -> list[dict[str, Any]]:
    """The chat messages of the request: its system prompt, then every turn."""
    messages = []
    if request.system:
        messages.append({"role": "system", "content": _text(request.system, "system")})
    for i, message in enumerate(request.messages):
        messages += _turn(message, f"messages.{i}")
    return messages


def chat_tools(request: MessagesInput) -> list[dict[str, Any]] | None:
    if not request.tools:
        return None
    tools = []
    for i, tool in enumerate(request.tools):
        if tool.type not in (None, "custom"):
            raise _bad(
                f"tools.{i}: tool type {tool.type!r} is not supported; this server runs "
                "client tools (name, description, input_schema)",
                f"tools.{i}.type",
            )
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(choice: AnthropicToolChoice | None) -> Any:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise _bad('tool_choice of type "tool" needs the tool\'s name', "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def thinking_fields(request: MessagesInput) -> dict[str, Any]:
    """The chat fields of ``thinking``: ``{"type": "disabled"}`` turns the chat
    template's thinking off (``enable_thinking: false``, as Qwen3's reads it);
    ``{"type": "enabled", "budget_tokens": N}`` caps the thinking at N tokens (the
    reasoning parser's ``thinking_token_budget``)."""
    thinking = request.thinking or {}
    if thinking.get("type") == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    budget = thinking.get("budget_tokens")
    if thinking.get("type") == "enabled" and isinstance(budget, int):
        return {"thinking_token_budget": budget}
    return {}


def response_format(output_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """``output_config.format`` as chat's ``response_format``."""
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad(
            'output_config.format must be {"type": "json_schema", "schema": {...}}',
            "output_config.format",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.get("schema")}}


def content_block(block: Block) -> dict[str, Any]:
    """One block as an Anthropic content block (a tool call's input parsed)."""
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": block.text, "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    try:
        arguments = json.loads(block.text) if block.text else {}
    except json.JSONDecodeError:
        arguments = {}  # cut short by max_tokens: stop_reason says so
    if not isinstance(arguments, dict):
        arguments = {"input": arguments}
    return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": arguments}


def stop_of(finish: Finish, tools_called: bool) -> tuple[StopReason, str | None]:
    """``stop_reason`` and ``stop_sequence`` for how the answer ended."""
    if finish.finish_reason == "length":
        return "max_tokens", None
    if tools_called:
        return "tool_use", None
    if isinstance(finish.stop_reason, str):
        return "stop_sequence", finish.stop_reason
    return "end_turn", None
