# Two commands on a fresh machine: `make test` (and `make demo` once training lands).
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-setup.py

.PHONY: test install

$(PYTHON):
	python3 -m venv $(VENV)

# Reinstall only when setup.py is newer than the last install.
$(STAMP): setup.py | $(PYTHON)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest -q tests
