"""A streamed chat completion read to its end, and what it showed: text, finish reason, `[DONE]`,
error events. A client's view: nothing here knows the gateway's internals."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

QUESTION = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
# an answer longer than any max_tokens the tests ask for: a stream still running at SIGTERM
LONG = [{"role": "user", "content": "Count from 1 to 200, separated by commas."}]


@dataclass
class StreamResult:
    status: int = 0
    text: str = ""
    finish_reasons: list[str] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    done: bool = False
    chunks: int = 0
    usage: dict | None = None
    chunks_after_first_text: int = 0

    @property
    def complete(self) -> bool:
        """Every part of a finished stream: 200, a finish reason, usage, `[DONE]`, no error event."""
        return self.status == 200 and self.done and not self.errors and len(self.finish_reasons) == 1 \
            and self.usage is not None and self.usage["completion_tokens"] >= 1


def chat_body(model: str, max_tokens: int, *, stream: bool = True, messages: list[dict] | None = None) -> dict:
    body = {"model": model, "messages": messages or QUESTION, "max_tokens": max_tokens, "temperature": 0}
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
                on_first_text: Callable[[], None] | None = None, headers: dict | None = None,
                messages: list[dict] | None = None) -> StreamResult:
    """POST a streamed chat completion and read it to the end (sync); `on_first_text` is called
    once the first text arrived (the chunks after it are counted)."""
    result = StreamResult()
    body = chat_body(model, max_tokens, messages=messages)
    with client.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers) as resp:
        result.status = resp.status_code
        if resp.status_code != 200:
            resp.read()
            result.errors.append({"status": resp.status_code, "body": resp.text[:500]})
            return result
        for line in resp.iter_lines():
            if line.startswith("data: "):
                had_text = bool(result.text)
                read_events(result, line[6:])
                if had_text:
                    result.chunks_after_first_text += 1
                elif on_first_text is not None and result.text:
                    on_first_text()
    return result
