"""Wire formats of the OpenAI chat completions subset the worker serves (vLLM-compatible extras included)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_services.models import tool_markup


class _Open(BaseModel):
    """Clients send many optional fields (temperature, seed, ...); unknown ones are accepted and ignored."""

    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str = "text"
    text: str | None = None


class FunctionCall(_Open):
    name: str
    arguments: str = "{}"


class ChatToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    def raw_text(self) -> str:
        """The text a model wrote for this message: content plus structured tool calls in markup form."""
        calls = "".join(tool_markup.render(c.function.name, c.function.arguments) for c in self.tool_calls or [])
        text = self.text()
        return text + calls if calls and not tool_markup.parse(text).tool_calls else text


class StreamOptions(_Open):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ChatCompletionRequest(_Open):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=1, description="one choice per request")
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _continuation_needs_assistant(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be an assistant message")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_names(self) -> tuple[str, ...]:
        names = []
        for tool in self.tools or []:
            function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            if isinstance(function.get("name"), str):
                names.append(function["name"])
        return tuple(names)
