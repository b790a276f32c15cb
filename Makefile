# The two commands of the README: `make demo` and `make test`. Both set up .venv/ first.
PY := .venv/bin/python

.PHONY: setup test demo clean-venv

setup:
	@bash scripts/setup-env.sh

# --dist loadscope: a module's tests on one worker, so that its trained runs (module fixtures) are made once
test: setup
	$(PY) -m pytest -q -n auto --dist loadscope tests

demo: setup
	PYTHONWARNINGS=ignore $(PY) scripts/demo.py

clean-venv:
	rm -rf .venv
