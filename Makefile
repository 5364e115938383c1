# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint unit unit-compiled integration browser node bench control-plane image test-images dist clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# the lock's versions as constraints (pip refuses hashes with an editable install)
	sed -n 's/^\([A-Za-z0-9][^ ]*==[^ ]*\( *;[^\\]*\)\?\).*/\1/p' requirements.lock > $(VENV)/constraints.txt
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[dev]'
	touch $(STAMP)

## Run configpin: the embedded default sources on https://127.0.0.1:8443, no cluster and no
## controller, whatever KUBECONFIG or ~/.kube/config say (serve reads neither). It acts on a
## cluster only when one is named: make run ARGS='--kubeconfig FILE' (docs/settings.md).
run: $(STAMP)
	env -u KUBERNETES_SERVICE_HOST $(BIN)/configpin serve $(ARGS)

## The whole suite: linters, import contracts, the unit tests on the pure-Python package and on
## the wheel with its core compiled by mypyc, then the integration tests, the dashboard's browser
## tests and the node tests on every control plane (1.20.2 and 1.36.2, provisioned and cached by hack/provision-control-plane.sh)
test: $(STAMP) lint
	$(BIN)/python hack/run-tests.py $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check webhook harness tests bench
	$(BIN)/ruff format --check webhook harness tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

unit: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

## The unit tests against the wheel with webhook/core compiled (laid out in build/compiled)
unit-compiled: $(STAMP)
	$(BIN)/python hack/compiled-tree.py build/compiled
	cd build/compiled && CONFIGPIN_EXPECT_COMPILED=1 $(abspath $(BIN))/python -m pytest \
	  -p no:cacheprovider tests/unit $(PYTEST_ARGS)

## Provision etcd, kube-apiserver and kube-controller-manager 1.20.2 and 1.36.2 (cached; the first
## time under 3.5 min on 2 cores: 1.20.2 is built from source, 200 s with the node's binaries,
## bench/README.md "The test suite's own time")
control-plane:
	hack/provision-control-plane.sh 1.20.2 >/dev/null
	hack/provision-control-plane.sh 1.36.2 >/dev/null

## The integration suite on one control plane: make integration K8S=1.36.2
integration: $(STAMP)
	KUBEBUILDER_ASSETS="$$(hack/provision-control-plane.sh $(or $(K8S),1.20.2))" $(BIN)/pytest -p no:cacheprovider tests/integration $(PYTEST_ARGS)

## The dashboard's browser suite on one control plane (Debian's chromium, installed when missing):
## make browser K8S=1.36.2
browser: $(STAMP)
	$(PYTHON) -m harness.browser >/dev/null
	KUBEBUILDER_ASSETS="$$(hack/provision-control-plane.sh $(or $(K8S),1.20.2))" $(BIN)/pytest -p no:cacheprovider tests/browser $(PYTEST_ARGS)

## configpin's image as an OCI archive (build/images/configpin.oci.tar), built from Debian's
## packages with no Docker daemon and no registry (docs/image.md); cached, rebuilt when its inputs change
image:
	$(PYTHON) -m harness.images configpin

## The test node's images: pause (its sandbox) and shell (busybox, for the tests' applications)
test-images:
	$(PYTHON) -m harness.images pause
	$(PYTHON) -m harness.images shell

## What a release publishes, in dist/: the wheel, the sdist, the chart package, the image archive,
## a CycloneDX SBOM, the krew plugin and SHA256SUMS, each proved by installing from it in a fresh
## place (docs/development.md#releasing). Not part of make test: it builds the image.
dist: $(STAMP) image
	$(BIN)/python hack/dist.py --out dist $(ARGS)

## The node suite on one control plane, as root: make node K8S=1.36.2 (docs/real-nodes.md)
node: $(STAMP)
	KUBEBUILDER_ASSETS="$$(hack/provision-control-plane.sh --node $(or $(K8S),1.20.2))" $(BIN)/pytest -p no:cacheprovider tests/node $(PYTEST_ARGS)

## One run of the admission benchmark (about 70 s: 72 s on 2026-11-27); the others: bench/README.md
bench: $(STAMP)
	$(BIN)/python -m bench.admission $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
