"""In-process vLLM (``LLM`` stepped by the harness): the engine (``engine``), its setup
(``setup``), the shared stepping thread (``stepper``, ``messages``, ``threads``), the engine-core
process choice (``process``) and its counters (``metrics``). vLLM's settings mapping, which the
managed server shares, is :mod:`engines.common.vllm_args`."""
