"""Load from other processes and hosts (``--client-workers``, ``--ray-address``): the worker
pool the runner deals requests to (``workers``), one worker process (``process``), and the same
workers as Ray actors with their clocks reconciled (``ray_actors``)."""
