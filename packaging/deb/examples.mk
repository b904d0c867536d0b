# SPDX-License-Identifier: MIT
#
# The example engines of libvase, built against the installed library with pkg-config alone
# (installed by libvase-dev as /usr/share/doc/libvase-dev/examples/Makefile). Copy this
# directory somewhere writable, then:
#
#   make                 synthetic_engine, reopen_engine and loadgen, linked to libvase.so
#   make STATIC=1        the same, with libvase.a linked in (the other libraries shared)
#
# Run one against a running vased: ./synthetic_engine --seqs=2 --duration=10 (as a user that
# vased admits; --runtime-dir=DIR for a daemon elsewhere than /run/vase).

PKG_CONFIG ?= pkg-config
CC ?= cc
CFLAGS ?= -O2 -g -Wall -Wextra
CPPFLAGS += -D_GNU_SOURCE
ENGINES := synthetic_engine reopen_engine loadgen

VASE_CFLAGS := $(shell $(PKG_CONFIG) --cflags vase)
ifeq ($(STATIC),)
VASE_LIBS := $(shell $(PKG_CONFIG) --libs vase)
else
# libvase.a by name, then what it needs (vase.pc's static_libs).
VASE_LIBS := $(shell $(PKG_CONFIG) --libs-only-L vase) -l:libvase.a \
             $(filter-out -lvase,$(shell $(PKG_CONFIG) --libs-only-l vase)) \
             $(shell $(PKG_CONFIG) --variable=static_libs vase)
endif
ifeq ($(strip $(VASE_LIBS))$(filter clean,$(MAKECMDGOALS)),)
$(error pkg-config finds no vase (install libvase-dev, or set PKG_CONFIG_PATH))
endif

all: $(ENGINES)

# An engine is NAME.c, and when it is longer than a file, the files NAME_*.c beside it with their
# header NAME.h.
.SECONDEXPANSION:
$(ENGINES): %: %.c $$(wildcard $$*_*.c $$*.h)
	$(CC) $(CPPFLAGS) $(VASE_CFLAGS) $(CFLAGS) -o $@ $(filter %.c,$^) $(LDFLAGS) $(VASE_LIBS) -lm

clean:
	rm -f $(ENGINES)

.PHONY: all clean
