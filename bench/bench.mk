# bench/bench.mk — the benchmark tools and the webhook test driver.
# Included by the top Makefile (which defines CC, WARN, CFLAGS, BUILD,
# EXTRA_CFLAGS); usable alone too:  make -f bench/bench.mk bench-tools
#
#   $(BUILD)/bin/cozygpu-load     HTTPS load generator (libcurl multi)
#   $(BUILD)/bin/cozygpu-bare     bare libmicrohttpd TLS server, fixed answer
#   $(BUILD)/tests/webhook_check  core/server/ with a toy review callback
#                                 (specs in spec/webhook/, bench stand-in)
#   $(BUILD)/bin/cozygpu-binder-bench  the binder's index, then its state machine (bench/binder.c)
#   make bench                    bench/bench.sh against the controller
#                                 (BENCH_TARGET_CMD / BENCH_ARGS to adjust),
#                                 the policy engine alone (timed, then its
#                                 instructions per review under callgrind
#                                 against bench/engine-instructions.baseline:
#                                 bench/engine-instructions.sh), then bench-binder
#   make bench-binder             the binder's index: 1k claims on 100 nodes,
#                                 10k on 1k, 100k on 10k, events on the full
#                                 state; then the same through the state
#                                 machine, every event kind + reconcile against
#                                 the 1 ms target, growth and peak RSS
#                                 (BINDER_BENCH_ARGS, e.g. --seed N,
#                                 --state-max-nodes N, --state-events N); then
#                                 bench/binder-growth.sh: the state machine's
#                                 growth in instructions (callgrind)

CC      ?= gcc
WARN    ?= -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE
CFLAGS  ?= -O2 -g
BUILD   ?= build

WEBHOOK_PKGS   := libmicrohttpd gnutls jansson yajl
WEBHOOK_CFLAGS := $(shell pkg-config --cflags $(WEBHOOK_PKGS) 2>/dev/null)
WEBHOOK_LIBS   := $(shell pkg-config --libs $(WEBHOOK_PKGS) 2>/dev/null) -lpthread -lm
# the webhook server (HTTP side, certificate pair) with the base layer
# (result codes, log, metrics, buffers, file reads)
WEBHOOK_SRC    := core/server/webhook.c core/server/webhook_http.c core/server/webhook_review.c core/server/tls.c \
	core/base/metrics.c core/base/log.c core/base/result.c core/base/buf.c core/base/file.c \
	core/base/jsonload.c core/base/utf8.c
WEBHOOK_HDR    := core/server/webhook.h core/server/webhook_internal.h core/server/tls.h core/base/metrics.h \
	core/base/log.h core/base/result.h core/base/buf.h core/base/file.h core/base/jsonload.h core/base/utf8.h

LOAD_PKGS      := libcurl jansson yaml-0.1
LOAD_CFLAGS    := $(shell pkg-config --cflags $(LOAD_PKGS) 2>/dev/null)
LOAD_LIBS      := $(shell pkg-config --libs $(LOAD_PKGS) 2>/dev/null) -lm

BENCH_LOAD  := $(BUILD)/bin/cozygpu-load
BENCH_BARE  := $(BUILD)/bin/cozygpu-bare
WEBHOOK_CHECK := $(BUILD)/tests/webhook_check

.PHONY: bench bench-tools bench-binder

bench-tools: $(BENCH_LOAD) $(BENCH_BARE) $(WEBHOOK_CHECK)

# the YAML loader with the base helpers it uses
LOAD_SRC := core/format/yamlload.c core/format/yamlescape.c core/format/yamlscalar.c core/base/buf.c core/base/b64.c core/base/utf8.c \
	core/base/file.c
LOAD_HDR := core/format/yamlload.h core/format/yaml_internal.h core/base/buf.h core/base/b64.h core/base/utf8.h \
	core/base/file.h

$(BENCH_LOAD): bench/load.c $(LOAD_SRC) $(LOAD_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -Icore $(LOAD_CFLAGS) -o $@ bench/load.c $(LOAD_SRC) $(LOAD_LIBS)

$(BENCH_BARE): bench/bare.c
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) $(WEBHOOK_CFLAGS) -o $@ bench/bare.c $(WEBHOOK_LIBS)

$(WEBHOOK_CHECK): spec/webhook/webhook_check.c $(WEBHOOK_SRC) $(WEBHOOK_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -Icore $(WEBHOOK_CFLAGS) -o $@ spec/webhook/webhook_check.c \
		$(WEBHOOK_SRC) $(WEBHOOK_LIBS)

# Until the controller serves webhooks, the target is the test driver.
# The controller command gets {cert} {key} {port_file} substituted.
BENCH_TARGET_CMD ?= $(WEBHOOK_CHECK) --cert {cert} --key {key} --port 0 --port-file {port_file} --workers 4 --log-level warn
BENCH_ARGS ?=

# the binder's index and state machine (core/binder/, header-only uthash) with its bench
BINDER_BENCH := $(BUILD)/bin/cozygpu-binder-bench
BINDER_BENCH_ARGS ?=
# the state machine's files (binder.h over binder_internal.h)
BINDER_SM_SRC := core/binder/binder_store.c core/binder/binder_queue.c core/binder/binder_choose.c \
	core/binder/binder_pass.c core/binder/binder_lazy.c core/binder/binder_held.c core/binder/binder_verify.c

BINDER_INDEX_SRC := core/binder/index.c core/binder/index_nodes.c core/binder/index_query.c

$(BINDER_BENCH): bench/binder.c $(BINDER_INDEX_SRC) core/binder/index.h core/binder/index_internal.h $(BINDER_SM_SRC) \
		core/binder/binder.h core/binder/binder_internal.h core/base/result.h core/base/result.c
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -Icore -o $@ bench/binder.c $(BINDER_INDEX_SRC) $(BINDER_SM_SRC) \
		core/base/result.c -lm

bench-binder: $(BINDER_BENCH)
	@echo "the binder's index alone, then its state machine (no API, no Lua): placement and events, medians of repeated runs:"
	$(BINDER_BENCH) $(BINDER_BENCH_ARGS)
	@echo
	bench/binder-growth.sh $(BINDER_BENCH)

bench: bench-tools $(ENGINE_BENCH)
	BUILD=$(BUILD) bench/bench.sh --target-cmd '$(BENCH_TARGET_CMD)' $(BENCH_ARGS)
	@echo
	@echo "the policy engine without HTTP or TLS (first its whole path, body to answer; then the review alone), each review timed:"
	$(if $(ENGINE_BENCH),$(ENGINE_BENCH) --cluster examples/classes --cluster examples/cluster examples/reviews)
	@echo
	$(if $(ENGINE_BENCH),bench/engine-instructions.sh $(ENGINE_BENCH))
	@echo
	@$(MAKE) --no-print-directory bench-binder
	@echo
	@$(MAKE) --no-print-directory bench-cluster
