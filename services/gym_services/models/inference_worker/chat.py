"""Wire formats of the OpenAI chat completions subset the worker serves (vLLM-compatible extras included)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_services.models import tool_markup
from gym_services.models.inference_worker.tokenizer import VOCAB_SIZE, tool_names


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


class Sampling(_Open):
    """What vLLM takes besides the prompt: limits, sampling settings and the token-information switches."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=1, description="one choice per request")
    temperature: float | None = Field(default=None, ge=0)
    seed: int | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False

    def token_limit(self) -> int | None:
        return self.max_tokens

    def sampling_key(self) -> str:
        """What the worker's log-probs depend on besides the context: the seed and the temperature."""
        return (
            f"{self.seed if self.seed is not None else 0}:{self.temperature if self.temperature is not None else 1.0}"
        )


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _no_text_continuation(self) -> ChatCompletionRequest:
        extra = self.model_extra or {}
        if extra.get("continue_final_message"):
            raise ValueError(
                "continue_final_message is not served: continue a generation from its token ids on /v1/completions"
            )
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_names(self) -> tuple[str, ...]:
        return tool_names(self.tools)

    def turns(self) -> list[tuple[str, str]]:
        return [(m.role, m.raw_text()) for m in self.messages]


class CompletionRequest(Sampling):
    """``/v1/completions`` with a token-id prompt (how a cut generation is continued)."""

    prompt: list[int] = Field(min_length=1, description="token ids; the built-in worker takes no text prompts")
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @model_validator(mode="before")
    @classmethod
    def _ids_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("prompt"), str):
            raise ValueError("the built-in worker takes token-id prompts only (render the chat with /tokenize)")
        return data

    @model_validator(mode="after")
    def _ids_in_range(self) -> CompletionRequest:
        bad = next((t for t in self.prompt if not 0 <= t < VOCAB_SIZE), None)
        if bad is not None:
            raise ValueError(f"prompt holds token id {bad}, outside the vocabulary 0..{VOCAB_SIZE - 1}")
        return self


class TokenizeRequest(_Open):
    """vLLM's ``/tokenize``: chat messages (rendered with the template) or a text prompt."""

    model: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give either messages or prompt")
        return self


class DetokenizeRequest(_Open):
    model: str | None = None
    tokens: list[int]
