"""Speed and memory benchmarks, each `python -m experiments.benchmarks.NAME [--quick]` printing one JSON line;
`python -m experiments.benchmarks.run_all` runs them all and writes BENCHMARKS.md."""
