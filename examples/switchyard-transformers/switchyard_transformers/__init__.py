"""Backend type `transformers` for Switchyard (see plugin.py)."""
