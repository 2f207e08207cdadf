"""The Messages and embeddings front-ends under per-key limits (`[[server.keys]]`): admitted with
`x-ratelimit-*` headers, refused with a 429 in each API's own shape (the official clients'
`RateLimitError`), and the key's budget settled on the usage the client saw."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.gateway.keys.gateways import PLAIN, Key, usage_of
from tests.gateway.script_server import backend
from tests.support.probes import wait_until
from tests.support.server import running_server

MESSAGES = Key("messages", {"rpm": 1, "budget_tokens": 100_000})
EMBEDDINGS = Key("embeddings", {"rpm": 1, "budget_tokens": 100_000})


def _config() -> str:
    text = "[server]\nhealth_interval_s = 0\n"
    for key in (MESSAGES, EMBEDDINGS, PLAIN):
        text += f'\n[[server.keys]]\nname = "{key.name}"\nkey = "{key.secret}"\n'
        text += "".join(f"{k} = {v}\n" for k, v in key.limits.items())
    return text + '\n[plugins]\ndisable = ["builtin"]\nmodules = ["tests.support.script_backend"]\n\n' + backend(
        "script", models=["claude-echo"])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("frontend-limits")
    with running_server(_config(), tmp) as url:
        yield url


def test_messages_count_against_the_key(base: str) -> None:
    with anthropic.Anthropic(base_url=base, api_key=MESSAGES.secret, max_retries=0, timeout=30) as claude:
        raw = claude.messages.with_raw_response.create(
            model="claude-echo", max_tokens=30, messages=[{"role": "user", "content": "one two three"}])
        message = raw.parse()
        assert (raw.headers["x-ratelimit-limit-requests"], raw.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
        used = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) + message.usage.output_tokens
        assert wait_until(lambda: usage_of(base, MESSAGES.name)["budget"]["used"] == used)
        with pytest.raises(anthropic.RateLimitError) as refused:
            with claude.messages.stream(model="claude-echo", max_tokens=30,
                                        messages=[{"role": "user", "content": "again"}]) as stream:
                stream.get_final_message()
    assert refused.value.body == {"type": "error", "error": {"type": "rate_limit_error",
                                                            "message": refused.value.body["error"]["message"]}}
    assert int(refused.value.response.headers["retry-after"]) >= 1


def test_embeddings_count_against_the_key(base: str) -> None:
    with openai.OpenAI(base_url=base + "/v1", api_key=EMBEDDINGS.secret, max_retries=0, timeout=30) as client:
        raw = client.embeddings.with_raw_response.create(model="claude-echo", input=[[1, 2, 3], [4, 5]])
        result = raw.parse()
        assert (raw.headers["x-ratelimit-limit-requests"], raw.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
        assert result.usage.total_tokens == 5
        assert wait_until(lambda: usage_of(base, EMBEDDINGS.name)["budget"]["used"] == 5)
        with pytest.raises(openai.RateLimitError) as refused:
            client.embeddings.create(model="claude-echo", input="again")
    assert refused.value.body["code"] == "rate_limit_exceeded"
    assert int(refused.value.response.headers["retry-after"]) >= 1
