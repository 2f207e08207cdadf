"""OpenAI's embeddings API (`POST /v1/embeddings`)."""
