# The two commands of the README: `make demo` and `make test`. Both set up .venv/ first.
PY := .venv/bin/python

.PHONY: setup test demo clean-venv

setup:
	@bash scripts/setup-env.sh

test: setup
	$(PY) -m pytest -q -n auto --dist loadgroup tests

demo: setup
	PYTHONWARNINGS=ignore $(PY) scripts/demo.py

clean-venv:
	rm -rf .venv
