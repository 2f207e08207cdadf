"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over the same events and
backends as chat completions: `schemas` (the wire structs), `translate` (request → RequestSpec),
`encode` (events → stream and message), `errors` (its error object), `handlers` (the routes).
"""

PATH_PREFIX = "/v1/messages"  # errors on these paths take Anthropic's shape (`gateway.errors`)
