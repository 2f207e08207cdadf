"""Switchyard's own inference engine: a small, real, continuous-batching engine for Llama-family
checkpoints (one concept per module).

    loader             config.json + safetensors -> ModelConfig, LlamaWeights
    llama              the forward pass over a flattened batch; ops through `kernels`
    attention_metadata the typed per-step batch description the model reads
    block_manager      paged KV blocks, block tables, prefix caching (hash chain, LRU)
    sequence           one choice's tokens and state
    scheduler          continuous batching, chunked prefill, priority, preemption
    model_runner       builds a step's inputs, runs the model, samples
    sampler            penalties, logit_bias, min_tokens, logprobs, kernels.sample
    output_processor   detokenize, stop strings / tokens, finish reasons
    engine             LLMEngine: step thread, asyncio-facing API, abort, liveness
    request_handle     the consumer's end of a request
    model_store, tokenizer, chat_template, detokenizer   the text side

Importing this package imports nothing heavy; `builtin_engine.engine` imports torch. It caps
OpenMP's spin-wait before torch loads (`cpu_threads.default_openmp_env`) and points
torch.compile's cache at Switchyard's (`compile_cache.default_compile_cache_env`).
"""

from builtin_engine.runner.compile_cache import default_compile_cache_env
from builtin_engine.runner.cpu_threads import default_openmp_env

default_openmp_env()
default_compile_cache_env()
