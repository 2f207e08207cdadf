"""`MESSAGES`: the wire format `open_stream` / `collect` serve a Messages request with."""

from __future__ import annotations

from typing import Any

from gateway.chat_completions import Observed, WireFormat
from gateway.messages_api.encode import MessageStream, build_message
from gateway.service import Gateway
from plugins.protocol import RequestSpec, Usage


def _new_stream(observed: Observed) -> MessageStream:
    return MessageStream(observed.spec)


def _build(gateway: Gateway, spec: RequestSpec, choices: list[Any], usage: Usage) -> Any:
    (choice,) = choices
    calls = [choice.tool_calls[i] for i in sorted(choice.tool_calls)]
    return build_message(spec, "".join(choice.reasoning), "".join(choice.text), calls, choice.finish_reason,
                         choice.stop_sequence, usage)


MESSAGES = WireFormat(new_stream=_new_stream, build=_build)
