"""What the Messages API does with each top-level request field (`gateway.http.fields`), for
`POST /v1/messages` and `/v1/messages/count_tokens`, with or without `?beta=true` (the beta
fields Claude Code sends included). The fields not listed are acted on; `translate` says how
(`output_config.effort` and `thinking` steer the template's `enable_thinking`,
`output_config.format` is a JSON-schema `response_format`, `metadata.user_id` is the `user` and,
where it is Claude Code's JSON, the session). Content the backends cannot take is refused by
`translate` with a 400 naming the block.
"""

from __future__ import annotations

from gateway.http.fields import FieldTable
from gateway.messages_api.schemas import CountTokensRequest, MessagesRequest

_STATELESS = "no state is kept between requests here, so there is no earlier context to edit"
IGNORED = {
    "cache_control": "a prompt-cache breakpoint: the backends cache prefixes on their own",
    "context_management": f"edits of the server-held context (clearing old thinking or tool results): {_STATELESS}",
    "speed": "one speed here: the backend's",
    "billing_policy": "Anthropic's billing; nothing is billed here",
}
REFUSED = {
    "mcp_servers": "the gateway connects to no MCP servers, so their tools would be missing from the answer",
}

MESSAGES_FIELDS = FieldTable(
    api="messages",
    struct=MessagesRequest,
    ignored={
        **IGNORED,
        "service_tier": "Anthropic's capacity tiers; every request here is served the same way",
        "diagnostics": "prompt-cache diagnostics against an earlier message, which is not kept here",
        "fallback_credit_token": "Anthropic's billing of a retry after a refusal; nothing is billed here",
        "fallbacks": "substitute models for a refusal on policy grounds, which the backends here do not make "
                     "(a route's own fallback applies)",
        "inference_geo": "requests are served where this gateway's backends run",
    },
    refused={
        **REFUSED,
        "container": "no code-execution containers run here",
        "compaction": "a compaction request answers with a signed `compaction` block, which no backend here makes",
        "thread": "server-held conversations (threads) are not kept here: send the whole conversation",
    },
)

COUNT_TOKENS_FIELDS = FieldTable(
    api="count_tokens",
    struct=CountTokensRequest,
    ignored={**IGNORED, "compaction": "the count is for the conversation as sent (as Anthropic counts it)"},
    refused=REFUSED,
)
