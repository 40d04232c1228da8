"""The HTTP client of an OpenAI-compatible server: the engine (``engine``), its options
(``options``), the run flags it and the managed servers take (``flags``), what the server is
(``server_info``), the SSE reader (``sse``) and the ``/metrics`` reader (``prom``)."""
