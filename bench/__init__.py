"""Benchmarks of the harness itself: see bench/README.md; run with ``python -m bench``."""
