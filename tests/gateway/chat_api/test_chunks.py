"""`ChunkEncoder`'s chunks are exactly the JSON of the OpenAI chunk objects, byte for byte,
whichever of its paths (a whole-chunk template for a plain text delta, or the pieces) wrote them."""

from __future__ import annotations

import msgspec
import pytest

from gateway.chat_api.chunks import ChunkEncoder
from plugins.contract.protocol import Usage

MODELS = ["bench-model", "a%db%%s%", 'q"uote\\', "ünï €"]
TEXTS = [" t5", "%d %s %b %%", 'new\nline "quoted" \\ \u2028 \x00', "ü€😀"]


def _expected(model: str, chat: bool, usage: object, choice: dict) -> bytes:
    obj = {"id": "chatcmpl-x%d", "object": "chat.completion.chunk" if chat else "text_completion",
           "created": 1700000000, "model": model, "system_fingerprint": "fp_%s", "choices": [choice]}
    if usage is not False:
        obj["usage"] = usage
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _encoder(model: str, chat: bool, include_usage: bool) -> ChunkEncoder:
    return ChunkEncoder(id="chatcmpl-x%d", created=1700000000, model=model, fingerprint="fp_%s", chat=chat,
                        include_usage=include_usage)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
def test_text_chunks_are_the_objects_json(model: str, chat: bool, include_usage: bool) -> None:
    encoder = _encoder(model, chat, include_usage)
    usage: object = None if include_usage else False
    for running in (False, True):
        if running:  # continuous usage stats: the chunks from now on carry it
            encoder.set_usage(Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1))
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                     "prompt_tokens_details": {"cached_tokens": 1}}
        for index in (0, 3):
            for text in TEXTS + [""]:
                for finish in (None, "stop"):
                    body = {"content": text} if chat and text else {}
                    choice = {"index": index, "delta": body} if chat else {"index": index, "text": text}
                    choice |= {"logprobs": None, "finish_reason": finish}
                    if text or finish:
                        assert encoder.text(index, text, finish=finish) == _expected(model, chat, usage, choice)
            logprobs = b'{"content":[],"refusal":null}'
            choice = {"index": index, "delta": {"content": "x"}} if chat else {"index": index, "text": "x"}
            choice |= {"logprobs": msgspec.json.decode(logprobs), "finish_reason": None}
            assert encoder.text(index, "x", logprobs) == _expected(model, chat, usage, choice)


@pytest.mark.parametrize("chat", [True, False])
def test_a_batch_of_one_token_is_what_the_general_loop_writes(chat: bool) -> None:
    """`_StreamState.feed` writes a batch of one plain text delta without its loop: the same bytes
    as the loop gives (the loop runs when a usage event, which writes nothing here, follows)."""
    from gateway.chat_api.encode import _StreamState
    from plugins.contract.protocol import RequestSpec, Sampling, TextDelta, TokenLogprob

    spec = RequestSpec(request_id="r", kind="chat" if chat else "completion", model="m", upstream_model="m",
                       sampling=Sampling(n=2))
    usage = Usage(prompt_tokens=1, completion_tokens=1)
    for event in [TextDelta(text=" t5", index=0), TextDelta(text="ü%d\n", index=1), TextDelta(text="", index=0),
                  TextDelta(text="x", index=0, logprobs=[TokenLogprob(token="x", logprob=-0.5)])]:
        one, looped = (_StreamState(_encoder("m", chat, True), spec) for _ in range(2))
        assert one.feed([event]) == looped.feed([event, usage])
