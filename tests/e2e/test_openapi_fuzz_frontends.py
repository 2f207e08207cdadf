"""Schemathesis over the Anthropic Messages and embeddings operations of the gateway's OpenAPI
document, in process over ASGI, with the scripted test backend behind it (tool calls, reasoning,
stop sequences, embeddings): no 5xx, documented statuses, content types and bodies (for a
Messages stream, every `event:` + `data:` pair), and every request the schema calls invalid
refused. See `test_openapi_fuzz.py` for the OpenAI operations.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from tests.e2e.test_openapi_fuzz import CHECKS, _settings  # noqa: E402
from tests.support.server import echo_config  # noqa: E402

CONFIG = "[server]\nmax_messages = 64\n\n" + echo_config(models=["claude-echo"], max_model_len=512).replace(
    'modules = ["tests.support.echo_backend"]', 'modules = ["tests.support.script_backend"]'
).replace('type = "echo"', 'type = "script"')
APP = create_app(parse_config(CONFIG, "<fuzz-frontends>"))
SCHEMA = schemathesis.openapi.from_asgi("/schema/openapi.json", APP)
SCHEMA.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
SENT: dict[str, int] = {}


def _test_for(path: str, examples: int):  # noqa: ANN202
    @SCHEMA.include(path=path).parametrize()
    @_settings(examples)
    def test(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS)
        SENT[path] = SENT.get(path, 0) + 1

    return test


test_messages = _test_for("/v1/messages", 150)
test_count_tokens = _test_for("/v1/messages/count_tokens", 40)
test_embeddings = _test_for("/v1/embeddings", 60)


def test_requests_were_generated() -> None:
    if len(SENT) < 3:
        pytest.skip("run with the whole module to count requests")
    print(f"schemathesis requests: {sum(SENT.values())} {SENT}")
    assert sum(SENT.values()) >= 400, SENT
