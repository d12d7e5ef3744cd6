# The README's two commands: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test venv clean

venv:
	@bash scripts/setup-venv.sh

demo: venv
	.venv/bin/vlrl demo --out runs/demo

test: venv
	.venv/bin/python -m pytest -q

clean:
	rm -rf runs .pytest_cache
