"""Training: the compiled step (step.py, update.py, batch.py, phases.py) and the host runtime that drives it
(loop.py, host.py, sweep.py, validation.py, checkpoint.py)."""
