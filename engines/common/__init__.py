"""What several engine families share: a local model's path and prompt ids (``local_model``),
stamped step outputs handed to the event loop (``handover``), ``malloc_trim`` after closes
(``heap``)."""
