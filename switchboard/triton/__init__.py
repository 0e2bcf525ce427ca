"""Thin Triton glue: turns Triton requests into plain objects and results back."""
