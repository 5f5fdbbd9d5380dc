"""Streaming a chat choice of a request with tools: what each text delta becomes.

A named function streams its arguments as they are generated (the first delta carries
the call's id and name, as OpenAI does).  With ``required`` the calls are sent whole
once the JSON list is complete; with ``auto`` plain content streams until the parser
sees a call start, and the calls are sent whole at the end.
"""

from __future__ import annotations

from minivllm.entrypoints.openai.protocol import DeltaMessage
from minivllm.entrypoints.openai.tools import (
    DeltaFunctionCall,
    DeltaToolCall,
    ToolPlan,
    random_tool_call_id,
    whole_call_deltas,
)


class ToolStream:
    """The streaming state of one choice."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.num_sent = 0
        """Characters of text already sent as content (auto mode)."""
        self.call_id: str | None = None
        self.tools_called = False

    def feed(self, delta: str) -> DeltaMessage | None:
        """The delta to send for newly generated ``delta`` text, or None (held back)."""
        self.text += delta
        mode = self.plan.mode
        if mode == "named":
            if self.call_id is None:
                self.call_id = random_tool_call_id()
                self.tools_called = True
                call = DeltaToolCall(
                    index=0,
                    id=self.call_id,
                    type="function",
                    function=DeltaFunctionCall(name=self.plan.named, arguments=delta),
                )
                return DeltaMessage(tool_calls=[call])
            if not delta:
                return None
            call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=delta))
            return DeltaMessage(tool_calls=[call])
        if mode == "required":
            return None
        if mode == "auto":
            assert self.plan.parser is not None
            end = self.plan.parser.content_end(self.text)
            if end <= self.num_sent:
                return None
            content, self.num_sent = self.text[self.num_sent : end], end
            return DeltaMessage(content=content)
        return DeltaMessage(content=delta) if delta else None

    def finish(self) -> DeltaMessage | None:
        """What was held back, once the choice has finished."""
        mode = self.plan.mode
        if mode not in ("auto", "required"):
            return None
        content, calls = self.plan.extract(self.text)
        if calls:
            self.tools_called = True
            return DeltaMessage(tool_calls=whole_call_deltas(calls))
        rest = self.text[self.num_sent :] if mode == "auto" else (content or "")
        self.num_sent = len(self.text)
        return DeltaMessage(content=rest) if rest else None
