"""The `builtin` backend type: Switchyard's own engine (`builtin_engine`) behind the contract —
the backend (`backend`), its options (`options`), how its engine is launched (`launch`), what
constrains its output (`tools`) and its embeddings (`embeddings`)."""
