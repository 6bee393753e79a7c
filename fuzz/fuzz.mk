# Fuzzing (fuzz/): libFuzzer targets built by clang, one per parser, into
# build-fuzz/ (never build/). Included by the Makefile.
#
#   make fuzz-deps                 clang and its fuzzer runtime (Debian)
#   make fuzz-build                build-fuzz/bin/fuzz_*
#   make fuzz [FUZZ_SECONDS=600]   seed the corpora, run every target for
#                                  FUZZ_SECONDS (make -j2 runs two at once)
#   make fuzz-run-fuzz_yaml        one target
#
# Each run prints one TAP line per target ("ok - fuzz_yaml: N execs, M
# execs/s, ..." or "not ok - ...") from libFuzzer's final statistics, and
# fails on any crash, leak, timeout or sanitizer report; the reproducer is
# left in build-fuzz/artifacts/<target>/ and the log in
# build-fuzz/logs/<target>.log. Reproducers of bugs found are kept in
# fuzz/regressions/<target>/ and rerun by every `make fuzz`.

FUZZ_BUILD   := build-fuzz
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := fuzz_yaml fuzz_json_lua fuzz_jsonload fuzz_luadecode fuzz_review fuzz_config fuzz_kubeconfig fuzz_inventory fuzz_pattern
FUZZ_DEB_PACKAGES := clang libclang-rt-14-dev
FUZZ_FIXTURES ?= $(or $(COZYGPU_FIXTURES),../shared/fixtures)
# objects: instrumented for coverage, ASan and UBSan; harnesses link libFuzzer
FUZZ_OBJ_FLAGS  := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LINK_FLAGS := -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined

.PHONY: fuzz fuzz-build fuzz-bins fuzz-deps fuzz-corpus fuzz-run $(FUZZ_TARGETS:%=fuzz-run-%)

fuzz-deps: deps
	@missing=""; for p in $(FUZZ_DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "fuzz-deps: installing$$missing"; \
		if [ "$$(id -u)" -eq 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		elif command -v sudo >/dev/null 2>&1; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		else echo "fuzz-deps: missing Debian packages:$$missing (run as root)"; exit 1; fi; \
	fi

fuzz-build: fuzz-deps
	@$(MAKE) --no-print-directory fuzz-bins BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) CFLAGS="-O1 -g" \
		EXTRA_CFLAGS="$(FUZZ_OBJ_FLAGS)"

# what each harness links (the layers it reaches, plus their libraries)
FUZZ_SRC_fuzz_yaml       := $(call layer_src,base format)
FUZZ_LIBS_fuzz_yaml      := $(PKG_LIBS)
FUZZ_SRC_fuzz_json_lua   := $(call layer_src,base format engine)
FUZZ_LIBS_fuzz_json_lua  := $(PKG_LIBS) -lm
FUZZ_SRC_fuzz_jsonload   := core/base/jsonload.c core/base/utf8.c
FUZZ_LIBS_fuzz_jsonload  := $(PKG_LIBS)
FUZZ_SRC_fuzz_luadecode  := $(call layer_src,base format engine)
FUZZ_LIBS_fuzz_luadecode := $(PKG_LIBS) -lm
FUZZ_SRC_fuzz_review     := $(call layer_src,base format engine admission)
FUZZ_LIBS_fuzz_review    := $(PKG_LIBS) -lm
FUZZ_SRC_fuzz_config     := $(call layer_src,base format)
FUZZ_LIBS_fuzz_config    := $(PKG_LIBS)
FUZZ_SRC_fuzz_kubeconfig := $(call layer_src,base format kube)
FUZZ_LIBS_fuzz_kubeconfig := $(PKG_LIBS) $(NET_LIBS)
FUZZ_SRC_fuzz_inventory  := $(call layer_src,base host)
FUZZ_LIBS_fuzz_inventory := $(PKG_LIBS) $(HOST_LIBS)
FUZZ_SRC_fuzz_pattern    := core/engine/pattern.c
FUZZ_LIBS_fuzz_pattern   := $(PKG_LIBS) -lm

FUZZ_BINS := $(FUZZ_TARGETS:%=$(BUILD)/bin/%)
fuzz-bins: check-deps $(FUZZ_BINS)

.SECONDEXPANSION:
$(BUILD)/bin/fuzz_%: fuzz/fuzz_%.c $$(call objs,$$(FUZZ_SRC_fuzz_$$*)) $(CORE_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(FUZZ_LINK_FLAGS) -Icore $(PKG_CFLAGS) $(NET_CFLAGS) $(HOST_CFLAGS) \
		-DFUZZ_SRCDIR='"$(CURDIR)"' -o $@ $< $(call objs,$(FUZZ_SRC_fuzz_$*)) $(FUZZ_LIBS_fuzz_$*) -lpthread

# seed corpora: build-fuzz/corpus/<target> (libFuzzer adds what it finds)
FUZZ_CORPUS := $(FUZZ_BUILD)/corpus
fuzz-corpus:
	@FUZZ_FIXTURES="$(FUZZ_FIXTURES)" fuzz/seed.sh $(FUZZ_CORPUS)

fuzz: fuzz-build
	@$(MAKE) --no-print-directory fuzz-corpus
	@$(MAKE) --no-print-directory -k fuzz-run

fuzz-run: $(FUZZ_TARGETS:%=fuzz-run-%)

$(FUZZ_TARGETS:%=fuzz-run-%): fuzz-run-%:
	@fuzz/run.sh $* $(FUZZ_BUILD) $(FUZZ_SECONDS)
