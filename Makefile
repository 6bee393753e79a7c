# cozygpu — build, dependencies, tests, demo.
# `make demo` and `make test` are the only commands a new user needs: both
# install what is missing first (Debian packages, through `make deps`).

CC      ?= gcc
PKGS    := lua5.4 jansson yaml-0.1 yajl
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -fPIC
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
# the controller's network side: API client, webhook HTTPS
NET_PKGS   := libcurl libmicrohttpd gnutls
NET_CFLAGS := $(shell pkg-config --cflags $(NET_PKGS) 2>/dev/null)
NET_LIBS   := $(shell pkg-config --libs $(NET_PKGS) 2>/dev/null) -lpthread
# the host side: the node inventory reads PCI functions through libpci
HOST_PKGS   := libpci
HOST_CFLAGS := $(shell pkg-config --cflags $(HOST_PKGS) 2>/dev/null)
HOST_LIBS   := $(shell pkg-config --libs $(HOST_PKGS) 2>/dev/null)

# Debian packages the build and the tests need (Debian 12). procps: pgrep
# in spec/cluster (no control plane process is left running). prometheus
# brings promtool, which spec/deploy/monitoring_spec.lua runs over the alert
# rules (check rules, test rules); nothing uses the Prometheus server the
# package also installs (on a systemd host its postinst starts it on :9090:
# `systemctl disable --now prometheus` if you do not want it).
DEB_PACKAGES := gcc make pkg-config lua5.4 liblua5.4-dev lua-busted \
	libjansson-dev libyajl-dev libyaml-dev libcurl4-openssl-dev libmicrohttpd-dev \
	libpci-dev libgnutls28-dev uthash-dev curl openssl procps haproxy prometheus valgrind kubectl
# kubectl is not a Debian package; deps checks for it but does not install it.
DEB_INSTALLABLE := $(filter-out kubectl,$(DEB_PACKAGES))

# core/ is layered (README "Layout"; spec/core/layers_spec.lua checks it):
# every folder is one layer and includes only itself and the layers below.
LAYERS := base format engine admission kube server host binder placement controller agent cli
layer_src = $(sort $(wildcard $(patsubst %,core/%/*.c,$(1))))
CORE_HDR  := $(wildcard core/*/*.h)
# the binary: every layer but the specs' Lua module
BIN_SRC := $(filter-out core/cli/luamod.c,$(call layer_src,$(LAYERS)))
# the C core as a Lua module for specs: no network side, no controller or agent
MOD_SRC := $(call layer_src,base format engine admission host) core/cli/luamod.c
# the policy engine alone (bench/engine.c)
ENGINE_SRC := $(call layer_src,base format engine)

BUILD      ?= build
# One object per source file, compiled once with every layer's flags;
# -MMD keeps the header dependencies (build/obj/**/*.d).
objs = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
ASAN_BUILD := build-asan
SAN_FLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

BUSTED := lua5.4 /usr/bin/busted

# The version lives in VERSION alone (the manifests' image tag must equal it:
# spec/deploy/version_spec.lua); the revision is the commit built.
VERSION  := $(shell cat VERSION 2>/dev/null)
ifeq ($(VERSION),)
$(error VERSION: the file is missing or empty (it holds the release version, e.g. 0.1.0))
endif
REVISION := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

.DEFAULT_GOAL := all
.PHONY: all deps check-deps test test-asan demo clean policies-configmap bench bench-binder cel image image-deps FORCE

BIN := $(BUILD)/bin/cozygpu
KUBE_CHECK := $(BUILD)/bin/kube_check

# the API server double (spec/support/kube-double) and the bench tools with
# the webhook test driver (bench/)
include spec/support/kube-double/double.mk
# `make bench`: the controller (with the double holding the examples) beside
# the bare TLS server; VMI reviews go to /validate/vmi, pods and classes to
# their own webhooks (the VM review, which no webhook receives, to the VMI
# path, where the controller refuses its kind). The bundle carries
# bench/hostile/rule.lua, and bench/hostile/review.yaml keeps one review
# thread stuck until its deadline during the "one thread stuck" runs.
BENCH_TARGET_CMD := env BENCH_OVERRIDE=bench/hostile/rule.lua BENCH_CONFIG=bench/hostile/config.yaml \
	bench/controller-target.sh {cert} {key} {port_file}
BENCH_ARGS ?= --path /validate/vmi --route Pod=/mutate/launcher --route GPUClass=/validate/gpuclass \
	--route GPUClaim=/validate/gpuclaim --hostile bench/hostile/review.yaml
ENGINE_BENCH := $(BUILD)/bin/cozygpu-engine-bench
include bench/bench.mk

# the policy engine alone, per phase (bench/engine.c)
$(ENGINE_BENCH): bench/engine.c $(call objs,$(ENGINE_SRC) core/admission/request.c core/admission/response.c)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) $(PKG_CFLAGS) -Icore -o $@ $^ $(PKG_LIBS) -lpthread -lm


# the policies ConfigMap, generated from policies/ (docs/decisions/0007)
POLICY_SRC := $(shell find policies -name '*.lua' | sort)
POLICIES_CM := deploy/21-policies-configmap.yaml
MOD := $(BUILD)/lua/cozygpu/core.so
# where the binary finds lua/ and policies/ unless --library/--policies say
# otherwise; set on the command line only (`make image` passes the paths
# inside the image), never taken from the environment
LIBDIR    := $(CURDIR)/lua
POLICYDIR := $(CURDIR)/policies
DIRS := -DCOZYGPU_LIBDIR='"$(LIBDIR)"' -DCOZYGPU_POLICYDIR='"$(POLICYDIR)"'
VERSION_DEFS := -DCOZYGPU_VERSION='"$(VERSION)"' -DCOZYGPU_REVISION='"$(REVISION)"'

all: check-deps $(BIN) $(MOD) $(DOUBLE_BIN) $(KUBE_CHECK) $(WEBHOOK_CHECK) $(BENCH_LOAD) $(BENCH_BARE) $(ENGINE_BENCH) $(BINDER_BENCH) $(POLICIES_CM)

$(POLICIES_CM): deploy/gen-policies-configmap.lua $(POLICY_SRC)
	lua5.4 deploy/gen-policies-configmap.lua -o $@ policies
policies-configmap: $(POLICIES_CM)

# Objects (see the pattern rule below) of a list of sources.
ALL_CFLAGS = $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -Icore $(PKG_CFLAGS) $(NET_CFLAGS) $(HOST_CFLAGS) $(DIRS) $(VERSION_DEFS)
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c -o $@ $<
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# The objects that print the version or the revision are rebuilt when either
# changes: the stamp is rewritten only then.
VERSION_STAMP := $(BUILD)/version.stamp
$(call objs,core/cli/main.c core/controller/controller.c): $(VERSION_STAMP)
$(VERSION_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(VERSION) $(REVISION)' | cmp -s - $@ 2>/dev/null || echo '$(VERSION) $(REVISION)' >$@
FORCE:

# test driver for the API client and watches (spec/kube); it counts watch
# restarts itself, so base/metrics.c is not linked
KUBE_CHECK_SRC := spec/kube/kube_check.c core/base/result.c core/base/log.c core/base/buf.c core/base/b64.c \
	core/base/utf8.c core/base/file.c core/format/yamlload.c core/format/yamlescape.c core/format/yamlscalar.c \
	core/kube/kube.c core/kube/kubeconfig.c core/kube/watch.c core/kube/watch_stream.c
$(KUBE_CHECK): $(call objs,$(KUBE_CHECK_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -o $@ $^ \
		$(shell pkg-config --libs libcurl jansson yaml-0.1) -lpthread

# the binary: build/bin/cozygpu
$(BIN): $(call objs,$(BIN_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -o $@ $^ $(PKG_LIBS) $(NET_LIBS) $(HOST_LIBS) -lm

# the C core as a Lua module for specs: require "cozygpu.core"
$(MOD): $(call objs,$(MOD_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -shared -o $@ $^ $(filter-out -llua5.4,$(PKG_LIBS)) $(HOST_LIBS) -lpthread -lm

# Install the Debian packages that are missing (needs root, or sudo).
deps:
	@missing=""; for p in $(DEB_INSTALLABLE); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		if [ "$$(id -u)" -eq 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		elif command -v sudo >/dev/null 2>&1; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		else echo "deps: missing Debian packages:$$missing"; echo "deps: run 'make deps' as root (or install them with apt-get)"; exit 1; fi; \
	fi; \
	command -v kubectl >/dev/null 2>&1 || echo "deps: note: kubectl is not installed; the CRD checks that use it are skipped"

check-deps:
	@pkg-config --exists $(PKGS) $(NET_PKGS) $(HOST_PKGS) || { echo "missing build dependencies: run 'make deps' (as root)"; exit 1; }
	@test -f /usr/include/uthash.h || { echo "missing build dependency uthash-dev (core/binder/): run 'make deps' (as root)"; exit 1; }
	@test -f /usr/include/valgrind/callgrind.h || { echo "missing build dependency valgrind (bench/binder.c counts instructions with callgrind): run 'make deps' (as root)"; exit 1; }

# CEL evaluator for the webhooks' matchConditions specs (npm registry;
# optional: those specs are pending without node)
CEL_MODULES := $(CURDIR)/build/cel/node_modules
cel:
	@if [ -f $(CEL_MODULES)/@bufbuild/cel/package.json ]; then :; \
	elif command -v npm >/dev/null 2>&1; then \
		npm install --prefix build/cel --no-audit --no-fund --silent @bufbuild/cel@0.6.1 || echo "cel: npm install failed; CEL specs will be pending"; \
	else echo "cel: no npm; the matchConditions evaluation specs will be pending"; fi

# the cluster specs (spec/cluster) find the control plane here
CLUSTER_ENV = COZYGPU_CLUSTER_BIN=$(CLUSTER_BIN) COZYGPU_KUBEVIRT_CRDS=$(KUBEVIRT_CRDS)

# the suite runs as busted processes at once: the cluster specs (waiting on
# real control planes, two groups) beside everything else
# (spec/support/run-suites.sh). test-asan runs everything else under ASan
# and UBSan; the cluster specs run once, in `make test` (twice they would
# put CI past its hour: each starts its own control plane).
test: deps cel cluster-bins
	@$(MAKE) --no-print-directory all
	COZYGPU_BUILD=$(BUILD) COZYGPU_CEL_MODULES=$(CEL_MODULES) $(CLUSTER_ENV) \
		spec/support/run-suites.sh $(CURDIR)/$(BUILD)/spectmp $(BUSTED)

test-asan: deps cel cluster-bins
	@$(MAKE) --no-print-directory all BUILD=$(ASAN_BUILD) EXTRA_CFLAGS="$(SAN_FLAGS) -O1"
	COZYGPU_BUILD=$(ASAN_BUILD) COZYGPU_ASAN=1 COZYGPU_CEL_MODULES=$(CEL_MODULES) $(CLUSTER_ENV) \
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	COZYGPU_CLUSTER_SPECS=0 spec/support/run-suites.sh $(CURDIR)/$(ASAN_BUILD)/spectmp $(BUSTED)

demo: deps
	@$(MAKE) --no-print-directory all
	@echo "== cozygpu review over examples/reviews against examples/cluster =="
	$(BIN) review --cluster examples/classes --cluster examples/cluster --config examples/config.yaml --output table examples/reviews
	@echo
	@echo "== the same, as AdmissionReview responses (first two) =="
	$(BIN) review --cluster examples/classes --cluster examples/cluster --config examples/config.yaml examples/reviews | head -2
	@echo
	@echo "== cozygpu policy test examples/policy-tests =="
	$(BIN) policy test examples/policy-tests

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

# `make image`: the OCI image archive build/cozygpu-image.tar (image/)
include image/image.mk

# `make cluster-bins`, `make cluster`: the local control plane (cluster/)
include cluster/cluster.mk

# `make fuzz`: libFuzzer targets for the parsers (fuzz/; docs/testing.md "Fuzzing")
include fuzz/fuzz.mk
