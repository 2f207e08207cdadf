"""Routing strategy `smooth_weighted` for Switchyard (see plugin.py)."""
