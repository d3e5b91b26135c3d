"""GPU benchmark scripts: each prints a table and writes JSON (results go into BENCHMARKS.md)."""
