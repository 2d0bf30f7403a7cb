"""Benchmarks against peers, run from the repository root as modules (`python -m bench.scrape`)."""
