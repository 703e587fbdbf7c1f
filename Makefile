# gpuwarden: `make run` serves the webhook locally on the bundled policies, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CACHE_DIR ?= $(HOME)/.cache/gpuwarden-e2e
export GPUWARDEN_CACHE_DIR := $(CACHE_DIR)
# mkdocs-material prints a notice about its successor on every build; the docs build quietly.
export NO_MKDOCS_2_WARNING := 1

.PHONY: run test lint typecheck unit e2e demo bench fuzz tools docs site simulate clean kfp-test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# gpuwarden[kfp] as pipeline authors install it, in a venv of its own: kfp 2.17 pins
# kubernetes<31, and the services' venv above needs a newer client (issue 34).
KFP_VENV := .venv-kfp
KFP_STAMP := $(KFP_VENV)/.installed

$(KFP_STAMP): pyproject.toml
	test -x $(KFP_VENV)/bin/python || $(PYTHON) -m venv $(KFP_VENV)
	$(KFP_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KFP_VENV)/bin/python -m pip install --quiet -e '.[kfp]' pytest pytest-asyncio
	touch $(KFP_STAMP)

## The gpuwarden.kfp tests (tests/pipelines), on pipelines compiled by the real kfp SDK.
kfp-test: $(KFP_STAMP)
	$(KFP_VENV)/bin/pytest tests/pipelines

## Build (or reuse from the cache) kube-apiserver, etcd, kubectl, helm, kube-scheduler and kwok for the e2e, chart and lab suites.
tools:
	bash hack/build-tools.sh

run: $(STAMP)
	$(BIN)/gpuwarden serve --policies policies --namespaces examples/namespaces.yaml \
		--cert-dir .cache/certs --host 127.0.0.1 --port 8443 --metrics-port 9090

lint: $(STAMP)
	$(BIN)/ruff check gpuwarden tests bench
	$(BIN)/ruff format --check gpuwarden tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy gpuwarden bench

unit: $(STAMP)
	$(BIN)/pytest -m "not e2e"

test: lint typecheck site tools kfp-test
	$(BIN)/pytest

demo: $(STAMP)
	bash hack/demo.sh

bench: $(STAMP) tools kyverno
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/load.py
	$(BIN)/python bench/apiserver.py

.PHONY: kyverno bench-peers

## Build (or reuse from the cache) Kyverno's admission controller and CLI; only the benchmarks use them.
kyverno:
	bash hack/build-kyverno.sh

## Pod creation through a real API server with no webhook, gpuwarden and Kyverno; the offline CLIs.
bench-peers: $(STAMP) tools kyverno
	$(BIN)/python bench/apiserver.py

fuzz: $(STAMP)
	GPUWARDEN_FUZZ_EXAMPLES=5000 $(BIN)/pytest tests/policy/test_fuzz.py

## Replay the built-in week of four tenants on the scheduling lab under each strategy (table + PNG).
simulate: $(STAMP) tools
	$(BIN)/gpuwarden simulate --plot .cache/simulate.png

## Regenerate the field reference (docs/reference.md), the CRD and the chart's schemas from the
## policy model, then build the documentation site.
docs: $(STAMP)
	$(BIN)/python hack/update-docs.py
	$(BIN)/mkdocs build --strict --site-dir .cache/site

## Build the documentation site (mkdocs.yml, docs/) into .cache/site; --strict fails on a broken
## link or anchor. `make test` runs this; it checks, and never rewrites, the generated files.
site: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir .cache/site

clean:
	rm -rf $(VENV) $(KFP_VENV) .cache .mypy_cache .ruff_cache .pytest_cache .hypothesis
