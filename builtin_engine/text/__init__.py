"""Text in and out of the engine: the tokenizer and incremental detokenizer, chat templates,
stop strings, and structured outputs (a request's `grammar` compiled into a per-sequence
matcher by `structured`)."""
