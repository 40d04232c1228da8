"""Workload views: a trace replay's own checks (`replay`), the per-turn table of a multi-turn run (`turns`), per-category comparisons (`categories`)."""
