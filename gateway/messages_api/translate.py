"""A Messages request → the backend-neutral `RequestSpec` (and a count_tokens request → a
`TokenizeRequest`), so every backend serves Anthropic's clients through the same events. The
conversation and its tools are `prompt.Prompt`'s; what goes around them is decided here:

- Thinking: the backends' one switch is the chat template's `enable_thinking`. `thinking`
  `enabled` (or `between_tools`) turns it on and `disabled` off, and a backend that cannot switch
  is a 400 (`chat_template_kwargs`). `adaptive` leaves the choice to effort: `low` off, `medium`
  and up (or none given: Anthropic's default is `high`) on — asked of backends that can switch,
  never a 400 elsewhere. The effort is `output_config.effort`, or the last system turn's
  `output_config.effort` (per-turn control). Without `thinking` effort changes nothing: the
  template's own default stands. `budget_tokens` bounds nothing here (thinking counts against
  `max_tokens`, as in Anthropic's API); `display: "omitted"` sends thinking blocks without their
  text (`encode`), the other displays the whole text.
- `output_config.format` (a JSON schema) is the answer's `response_format`.
- `metadata.user_id` is the request's `user` (a sticky route's key). Claude Code sends it as a
  JSON string holding its `session_id`: that is the request's `session` (`session_in_body`; the
  `X-Claude-Code-Session-Id` header, which carries the same id, is `gateway.http.sessions`'
  fallback for every API).
- `anthropic-beta` changes nothing: every beta field above is taken with or without its beta
  name, and no backend here speaks Anthropic's API, so there is no upstream to pass it to.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.messages_api import schemas as M
from gateway.messages_api.prompt import Prompt
from gateway.service.admission import RouteLimits
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import RequestSpec, Sampling, TokenizeRequest

def messages_spec(req: M.MessagesRequest, *, request_id: str, limits: RouteLimits = RouteLimits()) -> RequestSpec:
    """The request spec, its `max_tokens` under the route's `limits`."""
    if isinstance(req.thinking, M.ThinkingEnabled) and req.thinking.budget_tokens >= req.max_tokens:
        raise InvalidRequest("`thinking.budget_tokens` must be less than `max_tokens`.", param="thinking.budget_tokens")
    prompt = Prompt.of(req)
    template_kwargs, switched = thinking_switch(req, prompt.effort)
    extensions = set(_prompt_extensions(prompt))
    if switched:
        extensions.add("chat_template_kwargs")
    if req.top_k:
        extensions.add("top_k")
    sampling = Sampling(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or None,
        max_tokens=(max_tokens := limits.max_tokens_for(req.model, "max_tokens", req.max_tokens)),
        stop=tuple(req.stop_sequences or ()),
    )
    return RequestSpec(
        request_id=request_id,
        kind="chat",
        model=req.model,
        upstream_model="",
        sampling=sampling,
        messages=prompt.messages,
        stream=bool(req.stream),
        chat_template_kwargs=template_kwargs,
        add_generation_prompt=not prompt.continues,
        continue_final_message=prompt.continues,
        tools=prompt.tools,
        tool_choice=prompt.tool_choice,
        parallel_tool_calls=prompt.parallel_tool_calls,
        response_format=_response_format(req.output_config),
        user=req.metadata.user_id if req.metadata is not None else None,
        session=session_in_body(req),
        extensions=frozenset(extensions),
        max_tokens_asked=req.max_tokens if req.max_tokens != max_tokens else None,
    )


def count_tokens_request(req: M.CountTokensRequest, *, upstream_model: str) -> TokenizeRequest:
    """The prompt a create request with the same conversation would send, to tokenize: its
    length is that request's `input_tokens` + `cache_read_input_tokens`."""
    prompt = Prompt.of(req)
    template_kwargs, _ = thinking_switch(req, prompt.effort)
    return TokenizeRequest(
        upstream_model=upstream_model,
        messages=prompt.messages,
        add_special_tokens=False,
        add_generation_prompt=not prompt.continues,
        continue_final_message=prompt.continues,
        chat_template_kwargs=template_kwargs,
        tools=prompt.tools,
    )


def thinking_switch(req: M._Conversation, turn_effort: M.Effort | None) -> tuple[dict[str, Any] | None, bool]:
    """The template's `enable_thinking` for this request (None: the template's default), and
    whether the client demanded it (a backend that cannot switch is then a 400)."""
    thinking = req.thinking
    if isinstance(thinking, (M.ThinkingEnabled, M.ThinkingBetweenTools)):
        return {"enable_thinking": True}, True
    if isinstance(thinking, M.ThinkingDisabled):
        return {"enable_thinking": False}, True
    if isinstance(thinking, M.ThinkingAdaptive):
        effort = turn_effort or (req.output_config.effort if req.output_config is not None else None)
        return {"enable_thinking": effort != "low"}, False
    return None, False


def omits_thinking(req: M._Conversation) -> bool:
    """`thinking.display` is "omitted": thinking blocks go out without their text."""
    return getattr(req.thinking, "display", None) == "omitted"


def session_in_body(req: M.MessagesRequest) -> str | None:
    """The agent session the body names: the `session_id` in `metadata.user_id` when that is a
    JSON object (Claude Code's: `{"device_id", "account_uuid", "session_id"}`); None otherwise."""
    user_id = req.metadata.user_id if req.metadata is not None else None
    if not user_id or not user_id.startswith("{"):
        return None
    try:
        session = json.loads(user_id).get("session_id")
    except (ValueError, AttributeError):
        return None
    return session if isinstance(session, str) and session else None


def _prompt_extensions(prompt: Prompt) -> tuple[str, ...]:
    return ("continue_final_message", "add_generation_prompt") if prompt.continues else ()


def _response_format(config: M.OutputConfig | None) -> dict[str, Any] | None:
    if config is None or config.format is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": config.format.schema_, "strict": True}}
