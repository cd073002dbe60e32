"""airspeed velocity (asv) suites of kermac; see ``asv.conf.json`` and ``docs/benchmarks.md``."""
