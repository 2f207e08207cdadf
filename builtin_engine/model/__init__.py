"""The model: the Llama-family forward pass (`llama`), its weights loaded from a checkpoint
(`loader`) and packed for the CPU's matmuls (`packed_linear`), the per-step batch description it
reads (`attention_metadata`), and where checkpoints live on disk (`store`)."""
