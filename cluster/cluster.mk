# The local Kubernetes control plane the cluster specs run against, and
# `make cluster` for a newcomer (README "Against a real Kubernetes").
#
# Built once, from Kubernetes' and etcd's own Go modules through the Go
# module proxy, into a cache outside the repository; with a warm cache a
# rebuild is Go's own up-to-date check (seconds). Test tooling only: none of
# it is part of the cozygpu binary or image.
#
# KUBE_VERSION: the newest Kubernetes minor that the latest KubeVirt release
# (v1.9.0, July 2026) supports; KubeVirt supports the three newest
# Kubernetes minors out at its release: 1.34, 1.35, 1.36 (decision 0033).
KUBE_VERSION    := v1.36.3
# etcd: the version k8s.io/kubernetes $(KUBE_VERSION) requires (its go.mod)
ETCD_VERSION    := v3.6.8
KUBEVIRT_VERSION := v1.9.0

GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
COZYGPU_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cozygpu
CLUSTER_CACHE := $(COZYGPU_CACHE)/cluster-$(KUBE_VERSION)
CLUSTER_BIN   := $(CLUSTER_CACHE)/bin
KUBEVIRT_CRDS := $(CLUSTER_CACHE)/kubevirt-$(KUBEVIRT_VERSION)-crds.yaml
CLUSTER_BINS  := $(CLUSTER_BIN)/kube-apiserver $(CLUSTER_BIN)/kube-controller-manager \
	$(CLUSTER_BIN)/kube-scheduler $(CLUSTER_BIN)/kubectl $(CLUSTER_BIN)/etcd
# the modules come only from the Go module proxy; -trimpath and no VCS stamp
# keep a rebuild byte-stable
CLUSTER_GOENV := GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
# the shared fixtures (README): `make cluster` builds its GPU nodes' GPUNode
# status from their PCI ID excerpt and sysfs shapes, as the specs do
COZYGPU_FIXTURES ?= ../shared/fixtures
# where `make cluster` keeps its control plane (outside the repository)
CLUSTER_DIR ?= $(COZYGPU_CACHE)/cluster-run

.PHONY: cluster-bins cluster cluster-down bench-cluster

cluster-bins: $(CLUSTER_BINS) $(KUBEVIRT_CRDS)

# One `go build` for the Kubernetes commands: they share most packages.
# kubectl at the same version: the cluster specs compare what kubectl prints,
# and the machine's kubectl may be older than the supported skew (+/-1).
# Go's build cache decides what is stale; the binaries are rewritten only
# when go.mod, go.sum or KUBE_VERSION change (the stamp).
$(CLUSTER_BIN)/kube-apiserver $(CLUSTER_BIN)/kube-controller-manager $(CLUSTER_BIN)/kube-scheduler $(CLUSTER_BIN)/kubectl &: \
		cluster/kube/go.mod cluster/kube/go.sum
	@test -x "$(GO)" || { echo "cluster-bins: Go is missing (the machine's Go at /usr/local/go, or GO=...)"; exit 1; }
	@mkdir -p $(CLUSTER_BIN)
	@echo "cluster-bins: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $(KUBE_VERSION) (a cold build takes many minutes)"
	cd cluster/kube && $(CLUSTER_GOENV) $(GO) build -trimpath -ldflags "-s -w \
		-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
		-X k8s.io/component-base/version.gitMajor=1 \
		-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION))) \
		-X k8s.io/component-base/version.gitTreeState=clean" \
		-o $(CLUSTER_BIN)/ k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl
	@touch $(CLUSTER_BIN)/kube-apiserver $(CLUSTER_BIN)/kube-controller-manager $(CLUSTER_BIN)/kube-scheduler \
		$(CLUSTER_BIN)/kubectl

$(CLUSTER_BIN)/etcd: cluster/etcd/go.mod cluster/etcd/go.sum cluster/etcd/main.go
	@mkdir -p $(CLUSTER_BIN)
	@echo "cluster-bins: building etcd $(ETCD_VERSION)"
	cd cluster/etcd && $(CLUSTER_GOENV) $(GO) build -trimpath -ldflags "-s -w" -o $(CLUSTER_BIN)/etcd .

# KubeVirt's CRDs with KubeVirt's own schemas (cluster/kubevirt-crds)
$(KUBEVIRT_CRDS): cluster/kubevirt-crds/go.mod cluster/kubevirt-crds/go.sum cluster/kubevirt-crds/main.go
	@mkdir -p $(CLUSTER_CACHE)
	cd cluster/kubevirt-crds && $(CLUSTER_GOENV) $(GO) mod download kubevirt.io/kubevirt && \
		$(CLUSTER_GOENV) $(GO) run . "$$($(CLUSTER_GOENV) $(GO) list -m -f '{{.Dir}}' kubevirt.io/kubevirt)" >$@.tmp.$$$$ && \
		mv $@.tmp.$$$$ $@

# `make cluster`: the control plane with cozygpu deployed and the examples
# loaded (cluster/up.lua prints what to try); `make cluster-down` stops it.
# One at a time, in CLUSTER_DIR (outside the repository).
cluster: cluster-bins
	@$(MAKE) --no-print-directory all
	@if COZYGPU_CLUSTER_BIN=$(CLUSTER_BIN) cluster/cluster.sh status $(CLUSTER_DIR) 2>/dev/null; then \
		echo "cluster: already up in $(CLUSTER_DIR) ($(CLUSTER_DIR)/env); make cluster-down first"; exit 1; fi
	@cluster/cluster.sh down $(CLUSTER_DIR) >/dev/null 2>&1; rm -rf $(CLUSTER_DIR)
	@COZYGPU_BUILD=$(BUILD) COZYGPU_KUBE_VERSION=$(KUBE_VERSION) COZYGPU_CLUSTER_BIN=$(CLUSTER_BIN) \
		COZYGPU_KUBEVIRT_CRDS=$(KUBEVIRT_CRDS) COZYGPU_FIXTURES=$(COZYGPU_FIXTURES) lua5.4 cluster/up.lua $(CLUSTER_DIR)

cluster-down:
	@cluster/cluster.sh down $(CLUSTER_DIR) && echo "cluster: stopped (its logs stay in $(CLUSTER_DIR) until the next make cluster)"

# `make bench-cluster`: VMI creates through the real API server with and
# without cozygpu's webhooks, p99 ratio per rate (bench/cluster.lua;
# BENCH_CLUSTER_ARGS, e.g. --rates 10,25 --count 100). `make bench` ends with it.
bench-cluster: cluster-bins
	@$(MAKE) --no-print-directory all
	@COZYGPU_BUILD=$(BUILD) COZYGPU_KUBE_VERSION=$(KUBE_VERSION) COZYGPU_CLUSTER_BIN=$(CLUSTER_BIN) \
		COZYGPU_KUBEVIRT_CRDS=$(KUBEVIRT_CRDS) lua5.4 bench/cluster.lua $(BENCH_CLUSTER_ARGS)
