"""OpenAI's embeddings API (`POST /v1/embeddings`): the wire structs (`schemas`), the request's
inputs and checks (`translate`), the response (`encode`), and the handler that runs a request
across its attempts (`handlers`)."""
