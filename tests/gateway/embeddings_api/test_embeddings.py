"""`POST /v1/embeddings` through a real server and the official `openai` client, over the scripted
backend (whose vectors are a fixed function of each input)."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest

from tests.gateway.script_server import KEY, Server, wait_idle
from tests.support.probes import wait_until
from tests.support.script_backend import EMBEDDING_SIZE


def test_shape_and_usage(oai: openai.OpenAI) -> None:
    result = oai.embeddings.create(model="claude-echo", input=["one two", "three"])
    assert result.object == "list" and result.model == "claude-echo"
    assert [d.index for d in result.data] == [0, 1]
    assert all(d.object == "embedding" and len(d.embedding) == EMBEDDING_SIZE for d in result.data)
    assert all(math.isclose(sum(v * v for v in d.embedding), 1.0, rel_tol=1e-6) for d in result.data)
    assert result.usage.prompt_tokens == result.usage.total_tokens == 3


def test_float_and_base64_decode_equal(oai: openai.OpenAI, server: Server) -> None:
    floats = oai.embeddings.create(model="claude-echo", input="same text", encoding_format="float").data[0].embedding
    raw = httpx.post(server.base + "/v1/embeddings", headers={"authorization": f"Bearer {KEY}"},
                     json={"model": "claude-echo", "input": "same text", "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    decoded = list(struct.unpack(f"<{len(packed) // 4}f", packed))
    assert decoded == pytest.approx(floats, rel=1e-6)
    # the client asks for base64 by default and decodes it itself
    assert oai.embeddings.create(model="claude-echo", input="same text").data[0].embedding == pytest.approx(floats, rel=1e-6)


def test_batch_equals_one_by_one_and_repeats(oai: openai.OpenAI) -> None:
    texts = ["a cat", "a dog", "the sea"]
    batch = [d.embedding for d in oai.embeddings.create(model="claude-echo", input=texts, encoding_format="float").data]
    single = [oai.embeddings.create(model="claude-echo", input=t, encoding_format="float").data[0].embedding for t in texts]
    assert batch == single
    again = [d.embedding for d in oai.embeddings.create(model="claude-echo", input=texts, encoding_format="float").data]
    assert again == batch


def test_token_id_inputs(oai: openai.OpenAI) -> None:
    one = oai.embeddings.create(model="claude-echo", input=[5, 6, 7], encoding_format="float")
    many = oai.embeddings.create(model="claude-echo", input=[[5, 6, 7], [8]], encoding_format="float")
    assert len(one.data) == 1 and len(many.data) == 2
    assert many.data[0].embedding == one.data[0].embedding
    assert many.usage.prompt_tokens == 4


def test_dimensions(oai: openai.OpenAI) -> None:
    short = oai.embeddings.create(model="claude-echo", input="x y", dimensions=4, encoding_format="float")
    assert len(short.data[0].embedding) == 4
    with pytest.raises(openai.BadRequestError) as info:
        oai.embeddings.create(model="claude-echo", input="x y", dimensions=4096)
    assert info.value.body["param"] == "dimensions"


def test_bad_inputs_are_400(oai: openai.OpenAI, server: Server) -> None:
    for body, param in (
        ({"model": "claude-echo", "input": ""}, "input"),
        ({"model": "claude-echo", "input": []}, "input"),
        ({"model": "claude-echo", "input": ["a", 5]}, "input"),
        ({"model": "claude-echo", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "claude-echo", "input": "a", "dimensions": 0}, "dimensions"),
        ({"model": "claude-echo", "input": "a", "extra": 1}, "extra"),
    ):
        response = httpx.post(server.base + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param, response.text


def test_backend_without_embeddings_is_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="does not serve embeddings"):
        oai.embeddings.create(model="claude-plain", input="x")


def test_unknown_model_404_and_key_401(oai: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="nope", input="x")
    with openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.embeddings.create(model="claude-echo", input="x")


def test_user_is_a_sticky_key(oai: openai.OpenAI) -> None:
    """Route `claude-sticky` keys on `user`; its second target serves no embeddings, so a user
    either always succeeds or always gets the 400 — never a mixture."""
    for user in ("u1", "u2", "u3", "u4", "u5"):
        outcomes = set()
        for _ in range(3):
            try:
                oai.embeddings.create(model="claude-sticky", input="x", user=user)
                outcomes.add("ok")
            except openai.BadRequestError:
                outcomes.add("400")
        assert len(outcomes) == 1, user


def test_disconnect_cancels_the_backend(server: Server) -> None:
    request_id = "embeddings-disconnect-1"
    wait_idle(server)
    with pytest.raises(httpx.ReadTimeout):  # the slow backend takes 2 s; the client leaves at 0.3 s
        httpx.post(server.base + "/v1/embeddings", json={"model": "claude-slow", "input": "x"}, timeout=0.3,
                   headers={"authorization": f"Bearer {KEY}", "x-request-id": request_id})
    assert wait_until(lambda: server.cancel_log.exists() and request_id in server.cancel_log.read_text(), timeout=10)
