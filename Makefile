# cozygpu — build, dependencies, tests, demo.
# `make demo` and `make test` are the only commands a new user needs: both
# install what is missing first (Debian packages, through `make deps`).

CC      ?= gcc
PKGS    := lua5.4 jansson yaml-0.1
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -fPIC
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# Debian packages the build and the tests need (Debian 12).
DEB_PACKAGES := gcc make pkg-config lua5.4 liblua5.4-dev lua-busted \
	libjansson-dev libyaml-dev libcurl4-openssl-dev libmicrohttpd-dev \
	libpci-dev libgnutls28-dev kubectl
# kubectl is not a Debian package; deps checks for it but does not install it.
DEB_INSTALLABLE := $(filter-out kubectl,$(DEB_PACKAGES))

CORE_SRC := core/luajson.c core/yamlload.c core/manifest.c core/config.c \
	core/engine.c core/review.c core/policytest.c core/result.c
CORE_HDR := $(wildcard core/*.h)

BUILD      ?= build
ASAN_BUILD := build-asan
SAN_FLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

BUSTED := lua5.4 /usr/bin/busted

.PHONY: all deps check-deps test test-asan demo clean policies-configmap

BIN := $(BUILD)/bin/cozygpu
MOD := $(BUILD)/lua/cozygpu/core.so
DIRS := -DCOZYGPU_LIBDIR='"$(CURDIR)/lua"' -DCOZYGPU_POLICYDIR='"$(CURDIR)/policies"'

all: check-deps $(BIN) $(MOD)

# the binary: build/bin/cozygpu
$(BIN): $(CORE_SRC) core/main.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) $(PKG_CFLAGS) $(DIRS) -o $@ $(CORE_SRC) core/main.c $(PKG_LIBS) -lm

# the C core as a Lua module for specs: require "cozygpu.core"
$(MOD): $(CORE_SRC) core/luamod.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) $(PKG_CFLAGS) $(DIRS) -shared -o $@ $(CORE_SRC) core/luamod.c \
		$(filter-out -llua5.4,$(PKG_LIBS)) -lm

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
	@pkg-config --exists $(PKGS) || { echo "missing build dependencies: run 'make deps' (as root)"; exit 1; }

test: deps
	@$(MAKE) --no-print-directory all
	COZYGPU_BUILD=$(BUILD) $(BUSTED) --output=TAP spec

test-asan: deps
	@$(MAKE) --no-print-directory all BUILD=$(ASAN_BUILD) EXTRA_CFLAGS="$(SAN_FLAGS) -O1"
	COZYGPU_BUILD=$(ASAN_BUILD) COZYGPU_ASAN=1 \
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(BUSTED) --output=TAP spec

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
