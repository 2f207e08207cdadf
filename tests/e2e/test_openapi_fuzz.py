"""Schemathesis against the gateway's own OpenAPI document (`/schema/openapi.json`), in process
over ASGI, with the deterministic echo backend behind it.

Valid and invalid requests are generated from the schema (the request structs, vLLM's
extensions included); every answer must be no 5xx, a documented status, a documented content
type, and a body that matches the documented schema — for streams, every `data:` event (a
chunk, an error object, or `[DONE]`). Requests the schema calls invalid must be refused (4xx):
that is what proves the document describes the structs the gateway really decodes with.

CI sends over 2,000 requests (~3,200, ~25 s); `SWITCHYARD_LONG=1` (or `pytest --long`) ten times
the random examples (~5,800 requests, ~3 min).
"""

from __future__ import annotations

import os
import tempfile

import pytest

schemathesis = pytest.importorskip("schemathesis")  # a test dependency (pyproject's `test` extra)

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from tests.support.server import echo_config  # noqa: E402

LONG = os.environ.get("SWITCHYARD_LONG") == "1"
SCALE = 10 if LONG else 1
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance, negative_data_rejection]
# positive_data_acceptance is left out on purpose: cross-field rules (`stream_options` without
# `stream`, `top_logprobs` without `logprobs`, ...) refuse some requests each field allows.

STORE = f'[responses]\nsqlite_path = "{tempfile.mkdtemp()}/responses.sqlite3"\n\n'
CONFIG = "[server]\nmax_n = 4\nmax_messages = 64\n\n" + STORE + echo_config(models=["echo-1", "org/echo-2"], max_model_len=512).replace(
    'modules = ["tests.support.echo_backend"]', 'modules = ["tests.e2e.fuzz_backend"]'
).replace('type = "echo"', 'type = "fuzz_echo"')
APP = create_app(parse_config(CONFIG, "<fuzz>"))
SCHEMA = schemathesis.openapi.from_asgi("/schema/openapi.json", APP)
SCHEMA.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])

SENT: dict[str, int] = {}
BUDGET = {  # Hypothesis examples per operation (Schemathesis sends several requests per example)
    "/v1/chat/completions": 100,
    "/v1/completions": 70,
    "/v1/responses": 100,
    "/v1/responses/{response_id}": 20,
    "/v1/responses/{response_id}/cancel": 10,
    "/switchyard/render": 30,
    "/tokenize": 30,
    "/detokenize": 30,
    "/v1/models/{model_id}": 30,
}
MIN_REQUESTS = 2000


def _fuzz(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)
    SENT[case.operation.path] = SENT.get(case.operation.path, 0) + 1


def _settings(examples: int) -> settings:
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=not LONG, suppress_health_check=list(HealthCheck))


def _test_for(path: str):  # noqa: ANN202 - a schemathesis-parametrized test per operation
    @SCHEMA.include(path=path).parametrize()
    @_settings(BUDGET[path])
    def test(case: schemathesis.Case) -> None:
        _fuzz(case)

    return test


test_chat_completions = _test_for("/v1/chat/completions")
test_completions = _test_for("/v1/completions")
test_responses = _test_for("/v1/responses")
test_stored_response = _test_for("/v1/responses/{response_id}")
test_cancel_response = _test_for("/v1/responses/{response_id}/cancel")
test_render = _test_for("/switchyard/render")
test_tokenize = _test_for("/tokenize")
test_detokenize = _test_for("/detokenize")
test_model_card = _test_for("/v1/models/{model_id}")


@SCHEMA.include(path_regex="^/(v1/models|health|ready|metrics)$").parametrize()
@_settings(10)
def test_small_endpoints(case: schemathesis.Case) -> None:
    _fuzz(case)


def test_enough_requests_were_generated() -> None:
    total = sum(SENT.values())
    if set(SENT) < set(BUDGET):
        pytest.skip("run with the whole module to count requests")
    print(f"schemathesis requests: {total} {SENT}")
    # the deterministic coverage phase does not grow with SCALE; the random phase does
    assert total >= (2 * MIN_REQUESTS if LONG else MIN_REQUESTS), SENT
