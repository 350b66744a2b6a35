"""The command-line entry points (`ragen-train`, `ragen-sweep`, `ragen-eval`, `ragen-report` and the other scripts
here, each also `python -m experiments.<name>`), their shared flags (`experiments.cli`) and the benchmarks."""
