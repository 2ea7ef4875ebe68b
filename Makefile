# `make test` is the README's test command and what .ci/run calls; setup.sh must have run first.
VENV ?= .venv
PY := $(VENV)/bin/python
BENCH_ARGS ?=  # e.g. BENCH_ARGS="--round-trips 1000 --sizes 1" for a short run

.PHONY: test unit lint guest-image bench demo wheels

test: lint guest-image
	$(PY) -m pytest -q

unit:
	$(PY) -m pytest -q -m "not functional and not guest"

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

guest-image:
	bash tests/guest/build-image.sh

# dist/orion_guest-*.whl: the guest runtime with the native driver prebuilt (py3-none-<platform>), for guests and
# containers without a compiler: `pip install --no-index orion_guest-*.whl` there.
wheels:
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist ./guest_runtime

bench:
	$(PY) bench/wire_bench.py $(BENCH_ARGS)

demo: guest-image
	$(PY) -m tests.guest.kvm_demo
