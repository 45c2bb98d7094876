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

# Every figure of docs/benchmarks.md comes from one of these commands; each
# writes its output into $(BENCH_OUT), where it is checked in (history in
# git). scripts/bench-record keeps a command's output with the command line,
# the time and the host's load; a failed command leaves the last record.
BENCH_OUT := docs/benchmarks
RECORD    := scripts/bench-record

# The data path through real processes (bench.md, bench.json, bench.svg), the
# PyTorch comparison, then the in-process benchmarks of each area; last the
# cap tests, whose log lines are the figures (a failed bound stops make).
bench: build
	scripts/with-cluster.sh bench --out $(BENCH_OUT) --command "make bench"
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	  scripts/with-cluster.sh -- $(PYTHON) examples/python/compare.py --out $(BENCH_OUT) --command "make bench"; \
	else echo "bench: no torch for $(PYTHON); the graph against op-by-op comparison is skipped"; fi
	$(RECORD) $(BENCH_OUT)/launches.txt $(GO) test -run '^$$' -bench 'BatchLaunch|LaunchPath' -benchmem -count 3 ./accelerator/ ./internal/bench/
	$(RECORD) $(BENCH_OUT)/fairness.txt $(GO) test -run '^$$' -bench 'Fairness|Weights|NoisyNeighbour' -benchtime 1x -count 3 ./accelerator/
	$(RECORD) $(BENCH_OUT)/memory.txt $(GO) test -count=1 -run '^$$' -bench 'Ratio|PTE|Churn|Oversub' ./memory/
	$(RECORD) $(BENCH_OUT)/weight-swap.txt $(GO) test -count=1 -run '^$$' -bench WeightSwap -benchtime 1x ./mediator/
	$(RECORD) $(BENCH_OUT)/coherence.txt $(GO) test -count=1 -run '^$$' -bench SharedTable -benchtime 3x ./mediator/
	$(RECORD) $(BENCH_OUT)/tls.txt $(GO) test -run '^$$' -bench NodeLinkTLS -benchtime 1x -count 3 ./internal/bench/
	$(RECORD) $(BENCH_OUT)/metrics-observer.txt $(GO) test -run '^$$' -bench 'ObservedSmallCall|Replied|Clock' -count 10 -benchtime 20000x ./metrics/
	$(RECORD) $(BENCH_OUT)/journal.txt $(GO) test -count=1 -run '^$$' -bench 'JournalCost|JournalLiveChurn|Restore' -benchtime 1x ./mediator/
	$(RECORD) $(BENCH_OUT)/journal-paging.txt $(GO) test -count=3 -run '^$$' -bench JournaledPaging -benchtime 1x ./mediator/
	$(RECORD) $(BENCH_OUT)/caps.txt $(GO) test -count=1 -v -run 'TestFillCopyCharged|TestUnaliasCharged|TestLaunchPreparationIsCharged|TestBandwidthCap' ./accelerator/ ./mediator/

# What needs root: the mutual-TLS node link between two network namespaces
# over shaped veth links, and the start-to-exit time of docker run
# --runtime=vgpu against --runtime=runc (Docker, containerd and runc
# installed; see e2e/root).
bench-root:
	$(RECORD) $(BENCH_OUT)/tls-hosts.txt $(GO) test -run '^$$' -bench NodeLinkHosts -benchtime 1x -count 3 ./internal/bench/
	$(RECORD) $(BENCH_OUT)/docker-run.txt $(GO) test -run '^$$' -count=1 -bench DockerRun -benchtime 1x ./e2e/root/

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
