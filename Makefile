# vgpu — see README.md. Every target works on a fresh machine with Go.
GO        ?= go
# Debian's interpreter, with python3-torch, python3-numpy, python3-pytest and
# python3-pyflakes; the python3 first on PATH may be another one without them.
PYTHON    ?= /usr/bin/python3
BIN       := $(CURDIR)/bin
TOOLS     := $(BIN)/tools
STATICCHECK_VERSION := v0.8.2

.PHONY: build test test-go test-python demo bench bench-root e2e lint fuzz clean

# Static binaries: the hook runs in a container's runtime context and must not load
# the host's libc through a path the container could influence; vgpu-smi, which the
# runtime mounts into containers, must run in any image. vgpu-node is built with cgo,
# which NVML (--backend cuda) needs; built without, it serves sim only. go-nvml's C
# header marks much of NVML deprecated: those warnings say nothing about our code.
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ $$($(GO) list ./cmd/... | grep -v '/vgpu-node$$') ./examples/...
	CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" $(GO) build -o $(BIN)/ ./cmd/vgpu-node

# Every test: Go, then Python.
test: test-go test-python

# Unit, property and process-level end-to-end tests, with the race detector.
test-go:
	$(GO) test -race -timeout 20m ./...

# The Python package and vgpu.torch against real mediator processes (bin/).
test-python: build
	cd python && $(PYTHON) -m pytest -q -p no:cacheprovider tests

demo: build
	scripts/with-cluster.sh demo

bench: build
	scripts/with-cluster.sh bench --out docs/benchmarks --command "make bench"
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	  scripts/with-cluster.sh -- $(PYTHON) examples/python/compare.py --out docs/benchmarks --command "make bench"; \
	else echo "bench: no torch for $(PYTHON); the graph against op-by-op comparison is skipped"; fi

# Start-to-exit time of docker run --runtime=vgpu against --runtime=runc (root,
# Docker, containerd and runc installed; see e2e/root).
bench-root:
	$(GO) test -count=1 -run '^$$' -bench DockerRun -benchtime 1x ./e2e/root/

# End-to-end tests only: real processes (e2e/), and as root real Docker and
# containerd (e2e/root/, skipped when not root unless VGPU_E2E_REQUIRE_ROOT=1).
e2e:
	$(GO) test -race -count=1 -timeout 20m ./e2e/...

# Each fuzz target for FUZZTIME (default 20s).
FUZZTIME ?= 20s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(TOOLS)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...
	$(PYTHON) -m pyflakes python examples/python

clean:
	rm -rf $(BIN)
