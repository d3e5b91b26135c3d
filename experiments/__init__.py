"""Named experiments, the runner (`python -m experiments.run NAME`), CLI and benchmarks."""
