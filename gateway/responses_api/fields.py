"""What the Responses API does with each request field (`gateway.http.fields`): the fields not
listed here are acted on, some only for some values (`translate.check_request` refuses those
with a 400 naming them: `background: true`, `truncation: "auto"`, `top_logprobs` above 0,
`include: ["message.output_text.logprobs"]`).

Acted on beyond the obvious: `prompt_cache_key` is the request's agent session (`RequestSpec.session`,
a routing key); `include: ["reasoning.encrypted_content"]` seals each reasoning item's text into
its `encrypted_content`, which the gateway reads back when the item is resent; `store: false`
stores nothing; `reasoning.context` says which resent reasoning goes back to the model. Nested
settings no engine here takes (`text.verbosity`, `reasoning.summary`, `reasoning.mode`) are
accepted and echoed."""

from __future__ import annotations

from gateway.http.fields import FieldTable
from gateway.responses_api.schemas import ResponsesRequest

CACHE_HINT = "a hint for OpenAI's own prompt cache; the engines here cache prefixes by themselves"

RESPONSES_FIELDS = FieldTable(
    api="responses",
    struct=ResponsesRequest,
    ignored={
        "service_tier": "OpenAI's processing tiers; every request here is served the same way",
        "prompt_cache_options": CACHE_HINT,
        "prompt_cache_retention": CACHE_HINT,
        "safety_identifier": "an abuse-monitoring id for OpenAI; nothing here monitors",
        "max_tool_calls": "caps calls of OpenAI's built-in tools, which never run here",
        "background_options": "options of background runs; `background: true` itself is refused",
        "context_management": "OpenAI's server-side compaction past a token count; a prompt that fits is served whole, "
                              "one that does not is a `context_length_exceeded` error the client can compact on",
        "access_programs": "OpenAI's Cyber access programs; no model here has an access tier",
        "image": "image context compression; image input is refused here",
        "client_metadata": "Codex's own ids (session, turn, installation); its session also comes as `prompt_cache_key`",
    },
    refused={
        "conversation": "OpenAI-stored conversations; none are kept here: send the history in `input` or use "
                        "`previous_response_id`",
        "prompt": "a prompt template stored with OpenAI; no templates are kept here",
        "moderation": "no moderation model runs here; a request that asks for moderation must not pass unmoderated",
    },
)
