# inferencecache — see README.md. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
export GOTOOLCHAIN := local
# envtest control-plane binaries (etcd + kube-apiserver), built from the Go
# module proxy by hack/envtest-assets.sh and cached under ~/.cache.
ENVTEST_START_TIMEOUT ?= 120s
TEST_TIMEOUT ?= 45m
CHAOS_DURATION ?= 3m
BIN := $(CURDIR)/bin
# Modules of their own, so their dependencies (go-containerregistry, the
# Prometheus rule parser, the Grafana SDK, the Helm SDK) stay out of the main
# module's; `make test` and `make lint` cover them too. -mod=mod: rulestest,
# dashgen and chartcheck build the main module through a replace, so a
# dependency the main module gains reaches their go.sum without a manual tidy.
# The build flags (with CGO_ENABLED=0) of every binary a test runs
# (internal/testbin) and of the images: `make test` compiles ./cmd/... (and
# controller-gen, which the manifests' staleness test runs) with them first,
# so those tests only link.
TESTBIN_FLAGS := -trimpath
NESTED_MODULES := hack/images operator/config/prometheus/rulestest operator/config/grafana/dashgen hack/chartcheck
# Build tools (image build, chart render and compare, alert-rule tests,
# dashboard generation), tested without -race: their own code runs on one
# goroutine, and the goroutines of ours some of them start (a real server,
# to list the metrics it registers) are the server's, which the -race run
# covers in its own packages. Under the race detector the image test's layer
# compression alone took about 9 minutes, and the Prometheus and Grafana
# SDKs compiled a second time for it. `make test NO_RACE_MODULES=` runs them
# under -race too, after it. Every nested module requires the main module's
# versions of what both build (TestNestedModulesShareVersions), so each
# package compiles once per configuration.
NO_RACE_MODULES := hack/images hack/chartcheck operator/config/prometheus/rulestest operator/config/grafana/dashgen
# What the -race run skips or shrinks for its cost, run without it: the
# tokenizers' full golden checks, the allocation counts and memory bounds
# (the race detector allocates), the committed bench results (the whole
# trace under the race detector is minutes) and the full size of random
# walks and floods (the engine's differential test, the simulator's, NATS
# ingest). RACE_SKIPPED_PACKAGES are where those tests live; every test that
# consults raceEnabled must be in both (internal/testbin
# TestRaceSkippedRunsInFull).
RACE_SKIPPED_RUN := Golden|E2EPromptText|Allocs|^TestCommitted|^TestDifferentialAgainstReference$$|^TestIngestBatchMatchesIngest$$|^TestRun(Deterministic|Invariants)$$|^TestSweepRemovesEveryExpiredEntry$$|^TestRequestFloodLogsBounded$$|^TestNATS(TwoServersIdentical|RestartReplaysWindow|IngestEndToEnd|OutageLosesNothing)$$|^TestNewModelLookupsBoundMetrics$$|^TestManyModelsScrapeFlood$$|^TestIncrementalRandom$$|^TestRequestTokens(IncrementalEqualsFull|Concurrent)$$|^TestNativeMatchesJinja$$
RACE_SKIPPED_PACKAGES := ./tokenizer/... ./kvevents/ ./engine/ ./rpc/ ./server/ ./bench/ ./chattemplate/
# Every build of `make test` (the binaries, the -race run, the binaries
# tests build, the images) ignores cmd/server's default.pgo: with it, each
# dependency of cmd/server compiled once more for the binary and twice more
# under -race (for the package and for its test binary), about 45 % of a
# cold run's compile work (go test -debug-trace). The profile only changes
# inlining decisions; cmd/server's TestDefaultProfile checks that the
# compiler accepts it and that the functions it names still exist, and
# `make build` and `make images` build with it.
TEST_GOFLAGS := -pgo=off
# How `make test` tests a nested module (run in its folder; $$assets is the
# envtest folder).
NESTED_TEST = KUBEBUILDER_ASSETS=$$assets KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=$(ENVTEST_START_TIMEOUT) \
	$(GO) test -mod=mod -count=1 -timeout $(TEST_TIMEOUT)
# The Helm chart; hack/chartcheck checks it against operator/config and
# runs the Helm CLI of its go.mod (`go tool helm`).
CHART := charts/inferencecache

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every binary into bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: images
images: ## OCI image tarballs bin/images/{server,controller,kvevent-subscriber}.tar, no container daemon needed (hack/images); TAG=... overrides the tag operator/config/default pins, ARCH=... the machine's architecture.
	cd hack/images && $(GO) run . -repo $(CURDIR) -out $(BIN)/images $(if $(TAG),-tag $(TAG)) $(if $(ARCH),-arch $(ARCH))

.PHONY: run
run: ## Main job: start the server on embedded defaults, run a short load, print the report.
	$(GO) run ./cmd/demo

.PHONY: test
test: ## Run every test with -race (the build-tool modules in NO_RACE_MODULES without), and beside it, without -race, what that run skips (RACE_SKIPPED_RUN) (installs the envtest binaries and the reference tokenizers when missing).
	@export GOFLAGS="$${GOFLAGS:+$$GOFLAGS }$(TEST_GOFLAGS)" && \
	assets=$$(bash hack/envtest-assets.sh) && \
	echo "envtest assets: $$assets" && \
	tokenizers=$$(bash hack/tokenizer-assets.sh) && \
	echo "tokenizer assets: $$tokenizers" && \
	CGO_ENABLED=0 $(GO) build $(TESTBIN_FLAGS) ./cmd/... github.com/nats-io/nats-server/v2 sigs.k8s.io/controller-tools/cmd/controller-gen && \
	side=$$(mktemp) && sp= && trap 'if [ -n "$$sp" ]; then kill $$sp 2>/dev/null || true; fi; rm -f "$$side"' EXIT && \
	{ { CGO_ENABLED=0 TOKENIZER_ASSETS=$$tokenizers $(GO) test $(TESTBIN_FLAGS) -vet=off -count=1 \
		-run '$(RACE_SKIPPED_RUN)' $(RACE_SKIPPED_PACKAGES) || exit 1; \
	    for m in $(NO_RACE_MODULES); do \
		(cd $$m && CGO_ENABLED=0 $(NESTED_TEST) $(TESTBIN_FLAGS) ./...) || exit 1; \
	    done; } >"$$side" 2>&1 & sp=$$!; } && \
	TOKENIZER_ASSETS=$$tokenizers \
	KUBEBUILDER_ASSETS=$$assets KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=$(ENVTEST_START_TIMEOUT) \
		$(GO) test -race -timeout $(TEST_TIMEOUT) ./... && \
	for m in $(NESTED_MODULES); do case " $(NO_RACE_MODULES) " in *" $$m "*) continue;; esac; \
		(cd $$m && $(NESTED_TEST) -race ./...) || exit 1; done && \
	{ rc=0; wait $$sp || rc=$$?; sp=; cat "$$side"; exit $$rc; }

.PHONY: chaos
chaos: ## Chaos run (docs/scaleout.md): NATS, 3 servers, 4 fake engines with subscribers as real processes, one SIGKILLed every 5-10 s for CHAOS_DURATION (default 3m; CHAOS_SEED reruns a schedule), then every index checked against the engines' truth. `make test` runs it for 60 s.
	CHAOS_DURATION=$(CHAOS_DURATION) $(if $(CHAOS_SEED),CHAOS_SEED=$(CHAOS_SEED)) $(GO) test -count=1 -v -timeout 30m -run '^TestChaos$$' ./chaos/

.PHONY: test-short
test-short: ## Fast tests without -race or envtest (skips what needs them).
	$(GO) test -short ./...

.PHONY: bench
bench: ## Engine micro-benchmarks (lookup, ingest, memory per entry) with the reference model.
	$(GO) test -run '^$$' -bench 'LookupRouteChain64|IngestBlocks|MemoryPerEntry' -benchtime 2s -count 1 ./engine/

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, and helm lint of the chart with its defaults and each example.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	for m in $(NESTED_MODULES); do (cd $$m && $(GO) vet -mod=mod ./... && $(GO) tool -modfile=$(CURDIR)/go.mod staticcheck ./...) || exit 1; done
	cd hack/chartcheck && for f in "" $(wildcard $(CHART)/examples/*.yaml); do \
		$(GO) tool helm lint --strict --kube-version v1.29.0 -n inferencecache-system $(CURDIR)/$(CHART) $${f:+-f $(CURDIR)/$$f} || exit 1; \
	done

.PHONY: chart-sync
chart-sync: ## Refresh the chart's copies of operator/config manifests (CRDs, role, webhooks, rules, dashboards) and its README values table.
	cd hack/chartcheck && $(GO) test -count=1 -run 'TestChartCopiesInSync|TestValuesTable' ./... -rewrite

.PHONY: proto
proto: ## Regenerate the gRPC Go code from rpc/proto.
	bash hack/proto.sh

.PHONY: dashboards
dashboards: ## Regenerate the Grafana dashboards (operator/config/grafana/*.json) from their Go definitions in operator/config/grafana/dashgen.
	cd operator/config/grafana/dashgen && $(GO) run -mod=mod . -out ..

.PHONY: manifests
manifests: ## Regenerate CRDs and deepcopy code with controller-gen.
	bash hack/manifests.sh

.PHONY: tokenizer-golden
tokenizer-golden: ## Regenerate tokenizer/testdata/golden from @lenml/tokenizers (npm).
	bash hack/tokenizer-golden.sh

.PHONY: envtest
envtest: ## Build (or reuse) the envtest binaries and print their folder.
	@bash hack/envtest-assets.sh

.PHONY: profile
profile: ## Profile the server under a fixed loadgen scenario into profiles/ (CPU, heap, allocs, mutex, block); print the top entries.
	$(GO) build -o $(BIN)/server-profile ./cmd/server
	$(GO) run ./cmd/loadgen profile -server $(BIN)/server-profile -out profiles -quiet
	@for p in cpu allocs heap mutex block; do \
		echo; echo "== $$p (top 15)"; \
		$(GO) tool pprof -top -nodecount=15 profiles/$$p.pprof 2>/dev/null | sed -n '/flat%/,$$p'; \
	done

.PHONY: bench-report
# The Mooncake conversation trace (shared/, never copied here); from a git
# worktree: make bench-report TRACE=/work/shared/traces/mooncake_conversation_trace.jsonl
TRACE ?= ../shared/traces/mooncake_conversation_trace.jsonl

bench-report: ## Regenerate the routing-quality simulator reports (bench/results): the Mooncake trace (with the lag/interval sensitivity, and arrivals 1.5x and 2x faster), the chat, rag and shared-prompt workloads, at 1,000 and 4,000 blocks per replica; every workload at 1x under the legacy replica model (bench/results/legacy); and the P/D mode (bench pd).
	$(GO) build -o $(BIN)/bench ./cmd/bench
	$(BIN)/bench -trace $(TRACE) -out bench/results -name conversation -sensitivity > /dev/null
	for s in 1.5 2; do $(BIN)/bench -trace $(TRACE) -speedup $$s -out bench/results -name conversation-x$$s > /dev/null; done
	for w in chat rag shared-prompt; do $(BIN)/bench -workload $$w -out bench/results -name $$w > /dev/null; done
	$(BIN)/bench -sim-model legacy -trace $(TRACE) -out bench/results/legacy -name conversation > /dev/null
	for w in chat rag shared-prompt; do $(BIN)/bench -sim-model legacy -workload $$w -out bench/results/legacy -name $$w > /dev/null; done
	$(BIN)/bench pd -trace $(TRACE) -workloads "" -prefill 8 -decode 4 -out bench/results -name pd-mooncake > /dev/null
	$(BIN)/bench pd -out bench/results -name pd-synthetic > /dev/null

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)
