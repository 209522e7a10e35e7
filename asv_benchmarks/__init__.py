"""airspeed-velocity benchmarks for crossover (configured by asv.conf.json at the repository root)."""
