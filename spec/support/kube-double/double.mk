# kube-double: the Kubernetes API server double used by the specs.
# Included from the repository's Makefile (`include spec/support/kube-double/double.mk`),
# which defines CC, WARN, CFLAGS, EXTRA_CFLAGS and BUILD. Standalone:
#   make -f spec/support/kube-double/double.mk BUILD=build CC=gcc \
#        WARN='-std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE'
# ASan/UBSan build:
#   make -f spec/support/kube-double/double.mk BUILD=build-asan \
#        EXTRA_CFLAGS='-fsanitize=address,undefined -fno-omit-frame-pointer -O1'

CC     ?= gcc
BUILD  ?= build
CFLAGS ?= -O2 -g
WARN   ?= -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE

DOUBLE_DIR  := spec/support/kube-double
DOUBLE_BIN  := $(BUILD)/bin/kube-double
DOUBLE_SRC  := $(DOUBLE_DIR)/double.c $(DOUBLE_DIR)/select.c $(DOUBLE_DIR)/patch.c $(DOUBLE_DIR)/schema.c \
               $(DOUBLE_DIR)/pods.c $(DOUBLE_DIR)/gc.c
DOUBLE_PKGS := libmicrohttpd jansson gnutls
DOUBLE_CFLAGS = $(shell pkg-config --cflags $(DOUBLE_PKGS))
DOUBLE_LIBS   = $(shell pkg-config --libs $(DOUBLE_PKGS)) -lpthread

.PHONY: kube-double
kube-double: $(DOUBLE_BIN)

$(DOUBLE_BIN): $(DOUBLE_SRC) $(DOUBLE_DIR)/double.h $(DOUBLE_DIR)/double.mk
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) $(DOUBLE_CFLAGS) -o $@ $(DOUBLE_SRC) $(DOUBLE_LIBS)
