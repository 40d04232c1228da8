"""In-process Hugging Face ``generate``: the engine (``engine``), model loading (``models``), the
speculative methods' settings (``spec``), the streamer (``stream``) and the one thread generate
runs on (``thread``)."""
