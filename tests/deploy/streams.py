"""A streamed chat completion read to its end, and what it showed: text, finish reason, `[DONE]`,
error events. A client's view: nothing here knows the gateway's internals."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

QUESTION = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


@dataclass
class StreamResult:
    status: int = 0
    text: str = ""
    finish_reasons: list[str] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    done: bool = False
    chunks: int = 0
    usage: dict | None = None

    @property
    def complete(self) -> bool:
        """Every part of a finished stream: 200, a finish reason, usage, `[DONE]`, no error event."""
        return self.status == 200 and self.done and not self.errors and len(self.finish_reasons) == 1 \
            and self.usage is not None and self.usage["completion_tokens"] >= 1


def chat_body(model: str, max_tokens: int, *, stream: bool = True) -> dict:
    body = {"model": model, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def read_events(result: StreamResult, data: str) -> None:
    if data == "[DONE]":
        result.done = True
        return
    event = json.loads(data)
    result.chunks += 1
    if "error" in event:
        result.errors.append(event["error"])
        return
    if event.get("usage"):
        result.usage = event["usage"]
    for choice in event.get("choices", []):
        result.text += choice.get("delta", {}).get("content") or ""
        if choice.get("finish_reason"):
            result.finish_reasons.append(choice["finish_reason"])


def stream_chat(client: httpx.Client, base: str, model: str, max_tokens: int,
                on_first_text: Callable[[], None] | None = None, headers: dict | None = None) -> StreamResult:
    """POST a streamed chat completion and read it to the end (sync)."""
    result = StreamResult()
    with client.stream("POST", f"{base}/v1/chat/completions", json=chat_body(model, max_tokens), headers=headers) as resp:
        result.status = resp.status_code
        if resp.status_code != 200:
            resp.read()
            result.errors.append({"status": resp.status_code, "body": resp.text[:500]})
            return result
        for line in resp.iter_lines():
            if line.startswith("data: "):
                had_text = bool(result.text)
                read_events(result, line[6:])
                if on_first_text is not None and not had_text and result.text:
                    on_first_text()
    return result
