"""Benchmark scripts (see README.md); a package so that tests can reuse a data filler."""
