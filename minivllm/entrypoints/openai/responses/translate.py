"""A Responses request as chat messages and chat fields, and chat blocks as output items.

Input items become chat messages: a message item keeps its role (``developer`` is a
system message), ``function_call`` items join the assistant message before them as its
tool calls, a ``function_call_output`` is a ``tool`` message, and a ``reasoning``
item is left out of the prompt (chat templates drop earlier thinking too).
"""

from __future__ import annotations

from typing import Any

from minivllm.entrypoints.openai.chat_bridge import Block, Finish
from minivllm.entrypoints.openai.responses.protocol import (
    FunctionCallItem,
    FunctionToolChoice,
    IncompleteDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponsesRequest,
    ResponseUsage,
)
from minivllm.entrypoints.openai.serving_engine import OpenAIServingError

INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
"""The input item types this server runs."""
TEXT_PART_TYPES = ("input_text", "output_text", "text")
"""Content parts read as text (images, files and audio are not supported)."""
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _bad(message: str, param: str) -> OpenAIServingError:
    return OpenAIServingError(message, param=param)


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PART_TYPES or not isinstance(part.get("text"), str):
            raise _bad(
                f"{where}.content.{i}: content part type {kind!r} is not supported; this "
                f"server reads {', '.join(TEXT_PART_TYPES)} parts",
                f"{where}.content",
            )
        texts.append(part["text"])
    return "".join(texts)


def _str_field(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    """Append the chat message(s) of one input item."""
    if not isinstance(item, dict):
        raise _bad(f"{where} must be an object", where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role")
        messages.append({"role": role, "content": _text_of(item.get("content"), where)})
    elif kind == "function_call":
        call = {
            "id": _str_field(item, "call_id", where),
            "type": "function",
            "function": {
                "name": _str_field(item, "name", where),
                "arguments": _str_field(item, "arguments", where),
            },
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({
            "role": "tool",
            "tool_call_id": _str_field(item, "call_id", where),
            "content": output if isinstance(output, str) else _text_of(output, where),
        })  # fmt: skip
    elif kind != "reasoning":
        raise _bad(
            f"{where}: input item type {kind!r} is not supported; this server takes "
            f"{', '.join(INPUT_ITEM_TYPES)} items",
            where,
        )


def input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages of the request's ``input`` (a 400 naming a bad item)."""
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(request.input):
        _add_item(messages, item, f"input.{i}")
    if not messages and request.previous_response_id is None:
        raise _bad("input has no message; give some text or a message item", "input")
    return messages


def chat_tools(request: ResponsesRequest) -> list[dict[str, Any]] | None:
    """The request's function tools in chat's shape (a 400 for another kind)."""
    if not request.tools:
        return None
    tools = []
    for i, tool in enumerate(request.tools):
        if tool.get("type") != "function":
            raise _bad(
                f"tools.{i}: tool type {tool.get('type')!r} is not supported; this server "
                "runs function tools",
                f"tools.{i}.type",
            )
        _str_field(tool, "name", f"tools.{i}")
        if not isinstance(tool.get("parameters") or {}, dict):
            raise _bad(f"tools.{i}.parameters must be a JSON schema object", f"tools.{i}")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def response_format(request: ResponsesRequest) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (the structured-outputs path)."""
    fmt = request.text.format if request.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": schema}


def output_items(blocks: list[Block]) -> list[OutputItem]:
    """The output items of an answer's blocks."""
    return [output_item(block) for block in blocks]


def output_item(block: Block, status: str = "completed", item_id: str | None = None) -> OutputItem:
    """One block as an output item (``status`` "in_progress" while it streams; the
    stream keeps the ``item_id`` its first event gave)."""
    ids = {"id": item_id} if item_id is not None else {}
    if block.kind == "reasoning":
        texts = [ReasoningText(text=block.text)] if status == "completed" else []
        return ReasoningItem(content=texts, status=status, **ids)
    if block.kind == "text":
        parts = [OutputText(text=block.text)] if status == "completed" else []
        return OutputMessage(content=parts, status=status, **ids)
    assert block.call_id is not None and block.name is not None
    return FunctionCallItem(
        call_id=block.call_id, name=block.name, arguments=block.text, status=status, **ids
    )


def usage_of(finish: Finish) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=finish.num_prompt_tokens,
        output_tokens=finish.num_output_tokens,
        total_tokens=finish.num_prompt_tokens + finish.num_output_tokens,
    )


def end_status(finish: Finish) -> tuple[str, IncompleteDetails | None]:
    """The response's status and incomplete details for how the answer ended."""
    if finish.finish_reason == "length":
        return "incomplete", IncompleteDetails(reason="max_output_tokens")
    return "completed", None


def assistant_message(blocks: list[Block]) -> dict[str, Any]:
    """The answer as the assistant chat message a later turn's prompt shows."""
    content = "".join(b.text for b in blocks if b.kind == "text")
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    calls = [
        {"id": b.call_id, "type": "function", "function": {"name": b.name, "arguments": b.text}}
        for b in blocks
        if b.kind == "tool_call"
    ]
    if calls:
        message["tool_calls"] = calls
    return message
