"""The proxy backend types — `vllm`, `llamacpp`, `openai_compatible` — over one shared core
(`backend`): options, the upstream stream read into events (`stream`, `normalize`), upstream
errors mapped once (`errors`), and embeddings (`embeddings`)."""
