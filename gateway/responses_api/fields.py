"""What the Responses API does with each request field (`gateway.http.fields`): the fields not
listed here are acted on (some only for some values: `translate.check_request` refuses those with
a 400 naming them, e.g. `background: true`, `truncation: "auto"`)."""

from __future__ import annotations

from gateway.http.fields import FieldTable
from gateway.responses_api.schemas import ResponsesRequest

RESPONSES_FIELDS = FieldTable(
    api="responses",
    struct=ResponsesRequest,
    ignored={
        "service_tier": "OpenAI's processing tiers; every request here is served the same way",
        "prompt_cache_key": "a hint for OpenAI's own prompt cache; the engines here cache prefixes by themselves",
        "safety_identifier": "an abuse-monitoring id for OpenAI; nothing here monitors",
    },
)
