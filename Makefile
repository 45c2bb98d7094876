# vgpu — see README.md. Every target works on a fresh machine with Go.
GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS     := $(BIN)/tools
STATICCHECK_VERSION := v0.8.2

.PHONY: build test demo bench bench-root e2e lint fuzz clean

# Static binaries: the hook runs in a container's runtime context and must not load
# the host's libc through a path the container could influence.
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/... ./examples/...

# Unit, property and process-level end-to-end tests, with the race detector.
test:
	$(GO) test -race -timeout 20m ./...

demo: build
	scripts/with-cluster.sh demo

bench: build
	scripts/with-cluster.sh bench --out docs/benchmarks --command "make bench"

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

clean:
	rm -rf $(BIN)
