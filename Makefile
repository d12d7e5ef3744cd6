# The README's two commands: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test test-main test-vllm lint venv system clean

venv:
	@bash scripts/setup-venv.sh

# Debian packages the tests use for real: prometheus (the dashboard test) and chromium (the report check).
system:
	@bash scripts/setup-system.sh

demo: venv
	.venv/bin/vlrl demo --out runs/demo

# Two lanes: the main suite in .venv, then the vLLM lane (engine and serving tests) in .venv-vllm,
# which holds the CPU build of vLLM; see scripts/test-vllm.sh.
test: test-main test-vllm

# The formatter and the linter (ruff, configured in pyproject.toml): the tree must be clean under both.
lint: venv
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .

test-main: venv system lint
	.venv/bin/python -m pytest -q -m "not vllm"

test-vllm:
	@bash scripts/test-vllm.sh

clean:
	rm -rf runs .pytest_cache
