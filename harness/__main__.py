"""`python -m harness`: safe to import in vLLM's spawned processes (guarded entry point)."""

import sys

from harness.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
