"""The OpenAI Responses API (`/v1/responses`): its structs (`schemas`), the translation of a
request into a `RequestSpec` (`translate`), backend events → output items and typed stream
events (`encode`), serving and cancelling (`respond`), the response store (`store`) and the
HTTP handlers (`handlers`)."""
