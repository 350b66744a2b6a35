"""One module per study (experiments/studies/<name>/PROTOCOL.md), each `analyse(study folder, figure path) -> lines`;
`experiments/studies/analyse.py <name>` runs them."""
