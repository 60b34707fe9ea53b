"""Side-by-side benchmarks of mpsched and its peers; run ``python benchmarks/run.py``."""
