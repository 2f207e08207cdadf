"""What the Messages API does with each request field (`gateway.http.fields`): the fields not
listed here are acted on (content the backends cannot take is refused by `translate` with a 400
naming the block)."""

from __future__ import annotations

from gateway.http.fields import FieldTable
from gateway.messages_api.schemas import CountTokensRequest, MessagesRequest

MESSAGES_FIELDS = FieldTable(
    api="messages",
    struct=MessagesRequest,
    ignored={
        "service_tier": "Anthropic's capacity tiers; every request here is served the same way",
    },
)

COUNT_TOKENS_FIELDS = FieldTable(api="count_tokens", struct=CountTokensRequest)
