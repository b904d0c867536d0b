# vase: one GNU Makefile for the whole tree (no recursive make).
#
#   make                 build everything (first installing the Debian packages, when the
#                        compiler does not find the build's dependencies)
#   make DEPS_PREFIX=DIR the same against packages unpacked into DIR (dpkg-deb -x); no apt
#   make WERROR=0        nvcc's warnings not fatal (another machine's compilers)
#   make check           build and run every test and the vector runner
#   make check-valgrind  the same tests under valgrind
#   make check-boot      the .deb under a real systemd, in a booted Debian 12 root (as root)
#   make bench           the kernel benchmark table (every policy and dtype, Qwen3-4B shape)
#   make SANITIZE=address,undefined check
#   make V=1             show full commands

OPT ?= -O2 -g
KERNEL_OPT ?= -O3
SANITIZE ?=
USE_CUDA ?= auto
BUILD ?= build$(if $(SANITIZE),-san)
# The reference test vectors (tests/vectors/FORMAT.md); `make check VECTORS=DIR` runs another set.
VECTORS ?= tests/vectors/reference
PYTHON ?= /usr/bin/python3

ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-7s %s\n' $(1) $(2)
endif

# ---- Debian packages and library paths ---------------------------------------------------

# Besides the libraries: python3 and python3-numpy run the vector generator (python3-dev and
# libdlpack-dev build the Python package's extension, python3-venv makes the virtual environment
# in which PyTorch, transformers and pytest from PyPI test it: VENV below; libtcmalloc-minimal4
# is the allocator vLLM's CPU worker insists on, libnuma1 a library its kernels link and g++ the
# compiler PyTorch's inductor compiles its model with, for the vLLM plugin's tests), systemd
# gives the tools of check-systemd (systemd-analyze, systemd-sysusers, systemd-tmpfiles); scdoc
# writes the man pages and man-db's man renders them in make check (both optional for a build);
# libmicrohttpd-dev serves vased's metrics, and prometheus gives the promtool that make check
# runs on a scrape of them (a test tool only). The README's Set-up lists every one in a table,
# which tests/test_setup.sh keeps equal to this list.
DEB_PACKAGES := gcc make pkg-config libopenblas-pthread-dev libcmocka-dev libzmq3-dev \
                libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libinih-dev \
                python3 python3-numpy valgrind systemd clang-format \
                python3-dev python3-venv libdlpack-dev libtcmalloc-minimal4 libnuma1 g++ \
                scdoc man-db libmicrohttpd-dev prometheus
# tmux is the terminal in which tests/test_top_tmux.sh drives `vasectl top`; dpkg-dev's
# dpkg-shlibdeps names the library packages of `make deb`'s packages.
DEB_PACKAGES += tmux dpkg-dev

# DEPS_PREFIX=DIR builds against packages unpacked into DIR (`dpkg-deb -x PKG.deb DIR`, as on a
# machine without apt or network): their headers and libraries come from DIR/usr/include and
# DIR/usr/lib/<multiarch> (the programs find them there by RPATH, and through it the libraries'
# own dependencies, hence DT_RPATH rather than RUNPATH), protoc-c from DIR/usr/bin, and nothing
# is installed.
DEPS_PREFIX ?=
space := $(subst ,, )
ifneq ($(DEPS_PREFIX),)
override DEPS_PREFIX := $(abspath $(DEPS_PREFIX))
DEPS_MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
DEPS_LIBDIRS := $(wildcard $(DEPS_PREFIX)/usr/lib/$(DEPS_MULTIARCH) $(DEPS_PREFIX)/lib/$(DEPS_MULTIARCH))
DEPS_CFLAGS := -I$(DEPS_PREFIX)/usr/include -I$(DEPS_PREFIX)/usr/include/$(DEPS_MULTIARCH)
DEPS_LDFLAGS := $(foreach d,$(DEPS_LIBDIRS),-L$(d) -Wl,-rpath,$(d) -Wl,-rpath-link,$(d)) \
                -Wl,--disable-new-dtags
PROTOC_C ?= env LD_LIBRARY_PATH=$(subst $(space),:,$(strip $(DEPS_LIBDIRS))) $(DEPS_PREFIX)/usr/bin/protoc-c
else
DEPS_CFLAGS :=
DEPS_LDFLAGS :=
PROTOC_C ?= protoc-c
endif
DEPS_STAMP := $(BUILD)/.deps-$(shell echo $(DEB_PACKAGES) $(DEPS_PREFIX) | cksum | cut -d' ' -f1)

# The build's own dependencies are looked for first, as the compiler sees them: a program that
# includes their headers and links their libraries, and protoc-c. When they are found (from
# DEPS_PREFIX, or the compiler's own paths, CPATH and LIBRARY_PATH included) nothing is installed,
# whatever dpkg says; with DEPS_PREFIX, not finding them is an error that names the prefix.
DEPS_PROBE := $(BUILD)/.probe-deps
define DEPS_PROBE_SH
printf '%s\n' '#include <stdarg.h>' '#include <stddef.h>' '#include <stdint.h>' \
  '#include <setjmp.h>' '#include <cmocka.h>' '#include <zmq.h>' \
  '#include <protobuf-c/protobuf-c.h>' '#include <systemd/sd-daemon.h>' '#include <ini.h>' \
  '#include <microhttpd.h>' \
  'int main(void) { return 0; }' >$(DEPS_PROBE).c && \
$(CC) $(DEPS_CFLAGS) -o $(DEPS_PROBE) $(DEPS_PROBE).c $(LDFLAGS) \
  -lcmocka -lzmq -lprotobuf-c -lsystemd -linih -lmicrohttpd >$(DEPS_PROBE).log 2>&1 && \
$(PROTOC_C) --version >>$(DEPS_PROBE).log 2>&1
endef

# Missing packages are installed as root, or through sudo. A user who can do neither gets one
# line to paste into a root shell, and nothing is said to be installing (tests/test_setup.sh).
# `make deps` installs every missing package of DEB_PACKAGES (the test tools too), even when the
# build's own dependencies are found.
define APT_INSTALL_SH
missing=; \
for p in $(DEB_PACKAGES); do \
  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || \
    missing="$${missing:+$$missing }$$p"; \
done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ]; then SUDO=; \
  elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
  else echo "error: missing Debian packages; as root run: apt-get install -y $$missing" >&2; \
    exit 1; \
  fi; \
  echo "  APT     installing: $$missing"; \
  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || \
    { echo "error: apt-get install -y $$missing failed" >&2; exit 1; }; \
fi
endef

$(DEPS_STAMP):
	$(Q)mkdir -p $(BUILD)
	$(Q)if $(DEPS_PROBE_SH); then \
	  echo "  DEPS    found$(if $(DEPS_PREFIX), in $(DEPS_PREFIX),): nothing to install"; \
	elif [ -n "$(DEPS_PREFIX)" ]; then \
	  echo "error: DEPS_PREFIX=$(DEPS_PREFIX) lacks the build's headers, libraries or protoc-c:" >&2; \
	  tail -n 5 $(DEPS_PROBE).log >&2; exit 1; \
	else $(APT_INSTALL_SH); fi
	$(Q)touch $@

deps:
	$(Q)$(APT_INSTALL_SH)

# The pthread OpenBLAS lives under the compiler's multiarch directories, which only the
# compiler can name, and on a fresh machine the compiler is one of the packages above. So the
# paths are found after the packages are installed and written to CONFIG_MK, which is included:
# make builds it, then restarts with its values. A build without them would silently take
# whichever BLAS the alternatives system offers under the generic names (the serial OpenBLAS is
# not safe to call from several threads at once), so a missing pthread build stops it here. It
# is looked for under DEPS_PREFIX first, then in the system's directories, then in the
# openblas-pthread directories named by CPATH and LIBRARY_PATH.
CONFIG_MK := $(BUILD)/config.mk

$(CONFIG_MK): $(DEPS_STAMP) Makefile
	$(Q)multiarch=$$($(CC) -print-multiarch 2>/dev/null); \
	want_inc=/usr/include/$$multiarch/openblas-pthread; want_lib=/usr/lib/$$multiarch/openblas-pthread; \
	inc=; lib=; \
	for d in $(if $(DEPS_PREFIX),$(DEPS_PREFIX)$$want_inc) $$want_inc \
	    $$(echo "$${CPATH:-}:$${C_INCLUDE_PATH:-}" | tr ':' '\n' | grep '/openblas-pthread$$'); do \
	  [ -n "$$inc" ] || [ ! -f "$$d/cblas.h" ] || inc=$$d; \
	done; \
	for d in $(if $(DEPS_PREFIX),$(DEPS_PREFIX)$$want_lib) $$want_lib \
	    $$(echo "$${LIBRARY_PATH:-}" | tr ':' '\n' | grep '/openblas-pthread$$'); do \
	  [ -n "$$lib" ] || [ ! -f "$$d/libopenblas.so" ] || lib=$$d; \
	done; \
	if [ -z "$$multiarch" ] || [ -z "$$inc" ] || [ -z "$$lib" ]; then \
	  echo "error: no pthread OpenBLAS for $(CC) (multiarch '$$multiarch'): want" \
	    "$(if $(DEPS_PREFIX),$(DEPS_PREFIX)$$want_inc or )$$want_inc/cblas.h and" \
	    "$$want_lib/libopenblas.so from libopenblas-pthread-dev" >&2; \
	  exit 1; \
	fi; \
	{ echo "# Written by the Makefile for CC=$(CC); delete it to detect again."; \
	  echo "CONFIG_CC := $(CC)"; echo "CONFIG_DEPS_PREFIX := $(DEPS_PREFIX)"; \
	  echo "MULTIARCH := $$multiarch"; \
	  echo "BLAS_INC := $$inc"; echo "BLAS_LIB := $$lib"; } >$@.tmp && mv $@.tmp $@

# `make clean` and `make print-deb-packages` need neither packages nor paths. Another compiler
# or prefix means another detection.
CONFIG_FREE_GOALS := clean print-deb-packages
ifeq ($(and $(MAKECMDGOALS),$(if $(filter-out $(CONFIG_FREE_GOALS),$(MAKECMDGOALS)),,1)),)
include $(CONFIG_MK)
ifneq ($(CONFIG_CC)|$(CONFIG_DEPS_PREFIX),$(CC)|$(DEPS_PREFIX))
$(CONFIG_MK): FORCE
endif
endif

FORCE:
.PHONY: FORCE

NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(USE_CUDA),auto)
HAVE_CUDA := $(if $(NVCC),1,0)
else
HAVE_CUDA := $(USE_CUDA)
endif

# WERROR=0 makes nvcc's warnings (and its host compiler's) warnings again, for a machine whose
# compilers are not the ones this tree is kept warning-free with (tests/gpu/run.sh); the default,
# 1, is what `make check` and CI build with.
WERROR ?= 1
WERROR_ON := $(filter-out 0,$(WERROR))
comma := ,
WARN := -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wpointer-arith -Werror=implicit-function-declaration
CPPFLAGS += -D_GNU_SOURCE -MMD -MP -Ikernels -Ilib -Iproto -I$(BUILD)/proto -I$(BLAS_INC)
CFLAGS += $(OPT) $(WARN) -fPIC -pthread $(DEPS_CFLAGS)
LDFLAGS += -pthread $(DEPS_LDFLAGS)
ifneq ($(SANITIZE),)
CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SANITIZE)
endif
BLAS_LIBS := -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas

# What a build's objects depend on besides their sources: the compiler, the flags (OPT,
# SANITIZE, WERROR, DEPS_PREFIX), whether CUDA is built, nvcc's flags, and libvase's SONAME (which
# every link of it names). $(FLAGS_FILE) holds a
# checksum of them and is rewritten only when it changes, so `make OPT=-O0` or `make USE_CUDA=0`
# in an existing build rebuilds every object (and so every program) instead of linking objects
# compiled another way, and a plain `make` afterwards rebuilds them back.
# The checksum, BUILD_FLAGS_SUM, is taken once at the end of this file, from the global values:
# expanded in this recipe, the flags would be those of whichever object asked for the file first
# (target-specific values reach prerequisites), and each goal would rebuild everything.
FLAGS_FILE := $(BUILD)/.build-flags

$(FLAGS_FILE): FORCE
	$(Q)mkdir -p $(dir $@); \
	[ "$$(cat $@ 2>/dev/null)" = "$(BUILD_FLAGS_SUM)" ] || echo "$(BUILD_FLAGS_SUM)" >$@
LIBM := -lm

# ---- kernels/ -------------------------------------------------------------------------

# kernels/*.c are the CPU kernels; kernels/cuda/ is the CUDA backend (below), whose *_cuda.c are
# host code compiled against the toolkit's headers into the CUDA archive.
CUDA_HOST_SRCS := $(wildcard kernels/cuda/*_cuda.c)
KERNEL_SRCS := $(wildcard kernels/*.c)
KERNEL_OBJS := $(KERNEL_SRCS:%.c=$(BUILD)/%.o)
KERNEL_LIB := $(BUILD)/libvasekernels.a

$(BUILD)/kernels/%.o: CFLAGS += $(KERNEL_OPT)

$(KERNEL_LIB): $(KERNEL_OBJS)
	$(call say,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

# ---- CUDA (kernels/cuda/) ----
#
# With HAVE_CUDA=1: kernels/cuda/*.cu, and the host code kernels/cuda/*_cuda.c (the CUDA error mapping, the
# device lookup of the arenas), into build/libvasekernels_cuda.a (link it before
# libvasekernels.a, with $(CUDA_LIBS)), and the GPU test programs of tests/gpu/, built by `all`
# and run only by `make check-gpu` (tests/gpu/run.sh), never by `make check`. --fmad=false keeps
# nvcc from contracting multiply-adds that the CPU reference (ISO C, so no contraction) rounds
# separately; see kernels/cuda/internal_cuda.cuh.

CUDA_ARCH ?= 80 86 89 90
CUDA_PTX_ARCH ?= 90
CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
CUDA_LIB := $(BUILD)/libvasekernels_cuda.a
GPU_TEST_DIR := $(BUILD)/tests/gpu
GPU_PROGS := $(GPU_TEST_DIR)/compare_kernels $(GPU_TEST_DIR)/bench_plan_gpu \
             $(GPU_TEST_DIR)/run_vectors_cuda $(GPU_TEST_DIR)/bench_decode_gpu

ifeq ($(HAVE_CUDA),1)
CUDA_HOME ?= $(abspath $(dir $(NVCC))..)
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib) $(CUDA_HOME)/lib64)
CUDA_INC := $(CUDA_HOME)/include
# The CUDA runtime is linked statically (libcudart_static.a): vased, libvase and the Python
# extension built here need no libcudart.so where they run, so one build serves hosts with and
# without CUDA. The runtime loads the driver's libcuda.so.1 itself, at the first CUDA call, which
# only a configured CUDA arena makes (kernels/cuda/device_cuda.c names the missing library then).
CUDA_LIBS := -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
NVCCFLAGS := -O3 -std=c++17 --fmad=false -lineinfo $(if $(WERROR_ON),-Werror all-warnings) \
             $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(CUDA_PTX_ARCH),code=compute_$(CUDA_PTX_ARCH) \
             -Xcompiler -fPIC,-Wall,-Wextra$(if $(WERROR_ON),$(comma)-Werror) -Ikernels
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.cu.o)
CUDA_HOST_OBJS := $(CUDA_HOST_SRCS:%.c=$(BUILD)/%.o)

$(CUDA_HOST_OBJS): CPPFLAGS += -I$(CUDA_INC)

$(BUILD)/kernels/%.cu.o: kernels/%.cu $(FLAGS_FILE) | $(DEPS_STAMP)
	$(call say,NVCC,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(NVCC) $(NVCCFLAGS) -MD -MP -MF $(@:.o=.d) -c -o $@ $<

$(CUDA_LIB): $(CUDA_OBJS) $(CUDA_HOST_OBJS)
	$(call say,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(GPU_TEST_DIR)/%.o: CPPFLAGS += -I$(CUDA_INC) -Itests

# CUDA code of the GPU test programs (the benchmark's decode attention).
$(GPU_TEST_DIR)/%.cu.o: tests/gpu/%.cu $(FLAGS_FILE) | $(DEPS_STAMP)
	$(call say,NVCC,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(NVCC) $(NVCCFLAGS) -MD -MP -MF $(@:.o=.d) -c -o $@ $<

# Objects first, then the archives (in this order): the benchmarks' support objects use both.
$(GPU_TEST_DIR)/compare_kernels $(GPU_TEST_DIR)/bench_plan_gpu $(GPU_TEST_DIR)/bench_decode_gpu: \
		%: %.o $(CUDA_LIB) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) $(CUDA_LIBS) $(BLAS_LIBS) $(LIBM)

GPU_BENCH_SUPPORT := $(BUILD)/tests/argnum.o $(GPU_TEST_DIR)/bench_gpu.o
$(GPU_TEST_DIR)/bench_plan_gpu: $(GPU_BENCH_SUPPORT)
$(GPU_TEST_DIR)/bench_decode_gpu: $(GPU_TEST_DIR)/decode_attn.cu.o $(GPU_BENCH_SUPPORT)

# The vector runner with its CUDA backend linked in (run_vectors --cuda). Its support objects
# are those of TEST_SUPPORT_OBJS, named here because that is defined further down.
GPU_VECTOR_SUPPORT := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/npy.c tests/vcase.c tests/argnum.c))
$(GPU_TEST_DIR)/run_vectors_cuda: $(BUILD)/tests/run_vectors.o $(GPU_TEST_DIR)/vectors_cuda.o \
                                  $(GPU_VECTOR_SUPPORT) $(CUDA_LIB) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(CUDA_LIBS) $(BLAS_LIBS) $(LIBM)

all: $(CUDA_LIB) $(GPU_PROGS)

gpu: $(CUDA_LIB) $(GPU_PROGS)

# Builds with CUDA and runs the GPU checks; needs a GPU. GPU_REPORT is where the logs go.
check-gpu:
	$(Q)tests/gpu/run.sh $(GPU_REPORT)
else
gpu check-gpu:
	@echo "error: $@ needs the CUDA toolkit (nvcc not found, or USE_CUDA=0)" >&2; exit 1
endif

# The CUDA kernels on the CPU, through an emulation of CUDA (tests/gpu/emu/run.sh): indexing,
# barriers, selection order and NaN handling checked where there is no GPU. Needs g++ and
# python3, not nvcc; takes minutes, so `make check` does not run it.
check-gpu-emu: $(KERNEL_LIB)
	$(Q)BUILD=$(BUILD) VECTORS=$(VECTORS) tests/gpu/emu/run.sh

.PHONY: gpu check-gpu check-gpu-emu

# ---- end CUDA ----

# ---- CUDA arena ----
#
# The CUDA arena backends of vased (daemon/core/arena_cuda.c) and libvase (lib/cuda.c), and vased's
# CUDA planner (daemon/plan/planner_cuda.c), when HAVE_CUDA=1, else their refusing twins
# (daemon/core/arena_nocuda.c, lib/nocuda.c, daemon/plan/planner_nocuda.c): the variant not built is
# filtered out of DAEMON_SRCS and LIBVASE_SRCS (CUDA_ARENA_EXCLUDED). With CUDA, vased links the
# CUDA kernels (with the CPU kernels they use) and the runtime (DAEMON_CUDA_LIBS); libvase takes
# in only the compaction kernel and the host code of the CUDA archive (LIBVASE_CUDA_OBJS: no
# planner, no CPU scoring, no BLAS) and links the runtime (LIBVASE_CUDA_LIBS; the libvase.a that
# is installed carries the runtime inside, see LIBVASE_DIST_A). The driver library is never
# linked (its cuMem* entry points are looked up at run time). The unit tests of the two backends and of the CUDA planner link the
# runtime faked by tests/mock_cuda.c instead of libcudart and are built only with CUDA
# (CUDA_ARENA_TEST_SRCS are kept out of the generic test lists and added to TEST_PROGS as
# CUDA_ARENA_TESTS).

CUDA_ARENA_TEST_SRCS := tests/test_daemon_cuda_arena.c tests/test_daemon_cuda_planner.c \
                        tests/test_client_cuda.c

ifeq ($(HAVE_CUDA),1)
CUDA_ARENA_EXCLUDED := daemon/core/arena_nocuda.c daemon/plan/planner_nocuda.c lib/nocuda.c
DAEMON_CUDA_LIBS = $(CUDA_LIB) $(KERNEL_LIB) $(CUDA_LIBS) -lm
LIBVASE_CUDA_OBJS := $(addprefix $(BUILD)/kernels/cuda/,compact_cuda.cu.o runtime_cuda.cu.o) \
                     $(CUDA_HOST_OBJS)
LIBVASE_CUDA_LIBS = $(CUDA_LIBS)
CUDA_ARENA_TESTS := $(CUDA_ARENA_TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
MOCK_CUDA_OBJ := $(BUILD)/tests/mock_cuda.o

$(BUILD)/daemon/core/arena_cuda.o $(BUILD)/daemon/plan/planner_cuda.o $(BUILD)/lib/cuda.o \
$(MOCK_CUDA_OBJ) $(CUDA_ARENA_TESTS:%=%.o): CPPFLAGS += -I$(CUDA_INC)

# Everything that links vased's archive links the kernels' archives too.
$(BUILD)/libvased.a $(BUILD)/libvased_core.a: | $(CUDA_LIB) $(KERNEL_LIB)

# The backends' and the planner's host-side logic against the fake runtime: no libcudart, no
# GPU. The daemon tests take arena_cuda.o and planner_cuda.o (and what they need) from the daemon
# archive, with the CUDA archive's host code, the client test lib/cuda.o and that host code
# from libvase; the fake defines every other CUDA symbol they reach, kernels included.
DAEMON_CUDA_TESTS := $(BUILD)/tests/test_daemon_cuda_arena $(BUILD)/tests/test_daemon_cuda_planner
# The fake also stands in for the driver's library where the device lookup probes for it
# (MOCK_DLOPEN_WRAP).
MOCK_DLOPEN_WRAP := -Wl,--wrap=dlopen,--wrap=dlclose
$(DAEMON_CUDA_TESTS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(MOCK_CUDA_OBJ) \
                      $(BUILD)/tests/plan_fixture.o $(BUILD)/tests/log_capture.o \
                      $(BUILD)/libvased.a $(CUDA_HOST_OBJS) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(MOCK_DLOPEN_WRAP) -o $@ $^ -lcmocka $(ZMQ_LIBS) $(PROTOBUF_LIBS) $(SYSTEMD_LIBS) \
	  $(INIH_LIBS) $(MHD_LIBS) $(BLAS_LIBS) -lm

# The eviction cycle of test_client_cuda talks to a daemon faked at the channel.
CLIENT_CHAN_WRAPS := $(foreach f,send wait drain answered drop call,-Wl,--wrap=vase__chan_$(f)) \
                     -Wl,--wrap=vase__session_closed
$(BUILD)/tests/test_client_cuda: $(BUILD)/tests/test_client_cuda.o $(MOCK_CUDA_OBJ) \
                                 $(BUILD)/libvase.a $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -Wl,--wrap=close $(MOCK_DLOPEN_WRAP) -o $@ $^ -lcmocka $(ZMQ_LIBS) $(PROTOBUF_LIBS) \
	  $(BLAS_LIBS) -lm $(CLIENT_CHAN_WRAPS)

# test_daemon_cuda_arena also starts the real vased (no GPU here: it must refuse cuda:0).
$(BUILD)/tests/test_daemon_cuda_arena: | $(BUILD)/vased
else
CUDA_ARENA_EXCLUDED := daemon/core/arena_cuda.c daemon/plan/planner_cuda.c lib/cuda.c
DAEMON_CUDA_LIBS :=
LIBVASE_CUDA_OBJS :=
LIBVASE_CUDA_LIBS :=
CUDA_ARENA_TESTS :=
endif

# ---- end CUDA arena ----

# ---- proto/ --------------------------------------------------------------------------

PROTO_C := $(BUILD)/proto/vase.pb-c.c
PROTO_H := $(BUILD)/proto/vase.pb-c.h
PROTO_OBJ := $(BUILD)/proto/vase.pb-c.o
WIRE_OBJ := $(BUILD)/proto/wire.o

$(PROTO_H): proto/vase.proto | $(DEPS_STAMP)
	$(call say,PROTOC,$<)
	$(Q)mkdir -p $(BUILD)/proto
	$(Q)$(PROTOC_C) --c_out=$(BUILD)/proto -Iproto $<
$(PROTO_C): $(PROTO_H)
	@true

$(PROTO_OBJ): $(PROTO_C) $(FLAGS_FILE)
	$(call say,CC,$@)
	$(Q)$(CC) $(CPPFLAGS) $(filter-out -Wmissing-prototypes,$(CFLAGS)) -c -o $@ $<

# Everything outside kernels/ may include the generated header.
GENERATED_HEADERS := $(PROTO_H)

ZMQ_LIBS := -lzmq
PROTOBUF_LIBS := -lprotobuf-c
SYSTEMD_LIBS := -lsystemd
INIH_LIBS := -linih
MHD_LIBS := -lmicrohttpd

# ---- lib/: libvase; tools/vasectl/: vasectl ---------------------------------------------

# libvase needs only the kernels that carry no BLAS: views, compaction, policy names and the
# layout (with CUDA also LIBVASE_CUDA_OBJS, above).
LIBVASE_KERNEL_OBJS := $(addprefix $(BUILD)/kernels/,view.o compact.o policy.o layout.o)
# and the daemon's allocator, pure (no I/O, no state but its own), with which vase_size_seq()
# (lib/size.c) places sequences in an arena exactly as vased does.
LIBVASE_KERNEL_OBJS += $(BUILD)/daemon/core/alloc.o
$(BUILD)/lib/size.o: CPPFLAGS += -Idaemon/core
VASECTL_SRCS := $(wildcard tools/vasectl/*.c)
LIBVASE_SRCS := $(filter-out $(CUDA_ARENA_EXCLUDED),$(wildcard lib/*.c))
LIBVASE_OBJS := $(LIBVASE_SRCS:%.c=$(BUILD)/%.o)
LIBVASE_A := $(BUILD)/libvase.a
LIBVASE_SO := $(BUILD)/libvase.so
# The SONAME's number: libvase.so.$(LIBVASE_SOVERSION) (docs/operating.md, "Versions and
# compatibility").
LIBVASE_SOVERSION := 2
LIBVASE_LIBS := $(ZMQ_LIBS) $(PROTOBUF_LIBS) -lm $(LIBVASE_CUDA_LIBS)
VASECTL := $(BUILD)/vasectl

$(LIBVASE_A): $(LIBVASE_OBJS) $(PROTO_OBJ) $(WIRE_OBJ) $(LIBVASE_KERNEL_OBJS) $(LIBVASE_CUDA_OBJS)
	$(call say,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(LIBVASE_SO): $(LIBVASE_OBJS) $(PROTO_OBJ) $(WIRE_OBJ) $(LIBVASE_KERNEL_OBJS) $(LIBVASE_CUDA_OBJS)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,$(LIBVASE_SONAME) -Wl,--exclude-libs,ALL -o $@ $^ \
	  $(LIBVASE_LIBS)

# The libvase.a that is installed. With CUDA: libvase's objects and the members of the static
# CUDA runtime they use, in one relocatable object whose only global symbols are libvase's own
# (vase_*), so that an engine links it statically without the CUDA toolkit (vase.pc's
# Libs.private: -ldl -lrt -lstdc++), and the runtime inside cannot interpose on the engine's own
# CUDA runtime. (The tree's tests link $(LIBVASE_A), whose objects they wrap one by one.)
# Without CUDA it is $(LIBVASE_A) itself.
ifeq ($(HAVE_CUDA),1)
LIBVASE_DIST_A := $(BUILD)/dist/libvase.a
LIBVASE_DIST_LIBS := -lm -ldl -lrt -lstdc++ -pthread
$(LIBVASE_DIST_A): $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) -r -nostdlib -o $(@D)/libvase.o -Wl,--whole-archive $(LIBVASE_A) \
	  -Wl,--no-whole-archive -L$(CUDA_LIBDIR) -lcudart_static
	$(Q)objcopy --wildcard --keep-global-symbol='vase_*' $(@D)/libvase.o
	$(Q)rm -f $@ && $(AR) rcs $@ $(@D)/libvase.o
else
LIBVASE_DIST_A := $(LIBVASE_A)
LIBVASE_DIST_LIBS := -lm
endif

# The public headers of libvase, and nothing else, staged in one directory: what an engine
# compiles against (-I$(PUBLIC_INCLUDE)), and what an installation would copy. vase.h needs
# vase_types.h and vase_errors.h; the administrative API, vase_admin.h, also the generated
# vase.pb-c.h, whose messages are its replies. The examples, vasectl and tests/test_public_api.c
# see only this directory, so a public header that reaches for anything outside it breaks the
# build. libvase.so.2, the soname, is what programs linked to the shared
# library look for.
PUBLIC_HEADERS := lib/vase.h kernels/vase_types.h proto/vase_errors.h lib/vase_admin.h \
                  $(PROTO_H)
PUBLIC_INCLUDE := $(BUILD)/include
PUBLIC_STAMP := $(PUBLIC_INCLUDE)/.stamp

$(PUBLIC_STAMP): $(PUBLIC_HEADERS) Makefile | $(DEPS_STAMP)
	$(call say,STAGE,$(PUBLIC_INCLUDE))
	$(Q)rm -rf $(PUBLIC_INCLUDE) && mkdir -p $(PUBLIC_INCLUDE)
	$(Q)cp $(PUBLIC_HEADERS) $(PUBLIC_INCLUDE)/ && touch $@

$(LIBVASE_SO).$(LIBVASE_SOVERSION): $(LIBVASE_SO)
	$(Q)ln -sf $(notdir $<) $@

# vasectl is a client of libvase's public API like any other tool: it sees only the staged
# public headers (vase.h, vase_admin.h and the generated vase.pb-c.h its replies are typed by).
$(VASECTL_SRCS:%.c=$(BUILD)/%.o): CPPFLAGS := -D_GNU_SOURCE -MMD -MP -I$(PUBLIC_INCLUDE)
$(VASECTL_SRCS:%.c=$(BUILD)/%.o): | $(PUBLIC_STAMP)

$(VASECTL): $(VASECTL_SRCS:%.c=$(BUILD)/%.o) $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBVASE_LIBS)

# ---- python/: the vase Python package ---------------------------------------------------
#
# The extension module vase._vase, on CPython's limited API (one _vase.abi3.so serves every
# CPython >= 3.11 of the machine), is built into $(BUILD)/python/vase/ (PY_PKG), with the
# package's Python files copied beside it, so that each build directory holds a package made of
# its own objects: PYTHONPATH=<repo>/build/python. Like an engine it sees only the public
# headers (and DLPack's), and it links libvase.a statically (its objects are -fPIC), exporting
# nothing of it. Not built with SANITIZE: a sanitized extension loads only into a sanitized
# interpreter. python/pyproject.toml builds the same package for pip (`pip install ./python`,
# `make wheel`) from what $(PY_SETUP_JSON) says of this build.
# The version of everything built here: the daemon's (VASED_VERSION of daemon/state.h).
VERSION := $(shell sed -n 's/^\#define VASED_VERSION "\(.*\)"$$/\1/p' daemon/state.h 2>/dev/null)
PY_SRC_DIR := python/vase
PY_PKG := $(BUILD)/python/vase
PY_EXT := $(PY_PKG)/_vase.abi3.so
# The extension's sources: _vase.c (the module) and a file per type, with their header _vase.h.
# Their shared names stay inside the extension (-fvisibility=hidden): it exports PyInit__vase alone.
PY_EXT_SRCS := $(wildcard $(PY_SRC_DIR)/*.c)
PY_EXT_OBJS := $(PY_EXT_SRCS:$(PY_SRC_DIR)/%.c=$(BUILD)/python/obj/%.o)
# Besides libvase, the extension carries the CPU paged attention (_vase_attend.c over
# kernels/attend.c), which libvase does not: that file also sees kernels/vase_attend.h, a header
# that includes nothing of vase (so no second vase_types.h beside the public one).
PY_KERNEL_OBJS := $(BUILD)/kernels/attend.o
PY_EXT_INC := -I$(PUBLIC_INCLUDE)
# The paged attention runs on the OpenMP threads of the process (GCC's libgomp, which PyTorch
# loads too: one pool for both).
PY_OPENMP := -fopenmp
$(BUILD)/python/obj/_vase_attend.o $(BUILD)/python/obj/_vase_batch.o: PY_EXT_INC += -Ikernels
PY_FILES := $(wildcard $(PY_SRC_DIR)/*.py $(PY_SRC_DIR)/*.pyi $(PY_SRC_DIR)/py.typed)
# vase.vllm, the vLLM plugin (a subpackage), and the entry point vLLM finds it by: a
# distribution's entry_points.txt (group vllm.general_plugins) beside the package, so that a
# vLLM run with PYTHONPATH=build/python, or with the installed package, loads it.
PY_VLLM_FILES := $(wildcard $(PY_SRC_DIR)/vllm/*.py)
PY_STAGED := $(PY_FILES:$(PY_SRC_DIR)/%=$(PY_PKG)/%) $(PY_VLLM_FILES:$(PY_SRC_DIR)/%=$(PY_PKG)/%)
PY_DIST_INFO = vase-$(VERSION).dist-info
PY_ENTRY_POINTS = $(BUILD)/python/$(PY_DIST_INFO)/entry_points.txt
PY_INC = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_SETUP_JSON := $(BUILD)/python/setup.json

$(PY_STAGED): $(PY_PKG)/%: $(PY_SRC_DIR)/%
	$(Q)mkdir -p $(@D) && cp $< $@

$(PY_ENTRY_POINTS): Makefile
	$(Q)mkdir -p $(@D) && rm -rf $(filter-out $(@D),$(wildcard $(BUILD)/python/vase-*.dist-info)) && \
	  printf 'Metadata-Version: 2.1\nName: vase\nVersion: %s\n' '$(VERSION)' >$(@D)/METADATA && \
	  printf '[vllm.general_plugins]\nvase = vase.vllm:register\n' >$@

$(PY_EXT_OBJS): $(BUILD)/python/obj/%.o: $(PY_SRC_DIR)/%.c $(FLAGS_FILE) | $(DEPS_STAMP) $(PUBLIC_STAMP)
	$(call say,CC,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) -MMD -MP $(PY_EXT_INC) -I$(PY_INC) $(CFLAGS) $(PY_OPENMP) -fvisibility=hidden -c -o $@ $<

$(PY_EXT): $(PY_EXT_OBJS) $(PY_KERNEL_OBJS) $(LIBVASE_A) | $(PY_STAGED)
	$(call say,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) $(PY_OPENMP) -shared -Wl,--exclude-libs,ALL -o $@ $^ $(LIBVASE_LIBS)

# What setup.py builds the extension from: the version, the public headers, the kernels' folder
# (for vase_attend.h), and the link words of a program that links libvase statically (the
# self-contained archive, as vase.pc's static_libs has it) after the extension's kernel objects.
# Rewritten only when its text changes.
$(PY_SETUP_JSON): FORCE | $(DEPS_STAMP)
	$(Q)mkdir -p $(@D)
	$(Q)$(PYTHON) -c 'import json, sys; print(json.dumps({"version": sys.argv[1], \
	  "include": sys.argv[2], "kernels": sys.argv[3], "link": sys.argv[4:]}, indent=1))' \
	  '$(VERSION)' $(abspath $(PUBLIC_INCLUDE)) $(abspath kernels) $(abspath $(PY_KERNEL_OBJS)) \
	  $(abspath $(LIBVASE_DIST_A)) $(ZMQ_LIBS) $(PROTOBUF_LIBS) $(LIBVASE_DIST_LIBS) $(PY_OPENMP) >$@.tmp
	$(Q)if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

# A machine without Python's or DLPack's headers (python3-dev, libdlpack-dev; a GPU machine with
# only the packages DEPS_PREFIX holds) builds everything else and says, in one line, that the
# extension is left out.
ifeq ($(SANITIZE),)
PY_INC_NOW := $(PY_INC)
HAVE_PY_HEADERS := $(if $(PY_INC_NOW),$(shell \
  printf '\043include <Python.h>\n\043include <dlpack/dlpack.h>\nint v[PY_VERSION_HEX + DLPACK_VERSION];\n' | \
  $(CC) -fsyntax-only $(DEPS_CFLAGS) -I$(PY_INC_NOW) -x c - >/dev/null 2>&1 && echo 1))
ifeq ($(HAVE_PY_HEADERS),1)
all: $(PY_EXT) $(PY_STAGED) $(PY_ENTRY_POINTS) $(PY_SETUP_JSON) $(LIBVASE_DIST_A) \
     $(PY_KERNEL_OBJS)
else
all: py-ext-skipped
py-ext-skipped:
	@echo "  SKIP    $(PY_EXT): no Python.h or dlpack/dlpack.h for $(PYTHON) (python3-dev, libdlpack-dev)"
.PHONY: py-ext-skipped
endif
endif

# ---- the Python environment ----------------------------------------------------------
#
# Every Python part that needs PyTorch or transformers (the package's tests, examples/llm, the
# kvpress comparison, make wheel) runs in one virtual environment, $(VENV), made once from
# Debian's python3 (python3-venv) with the exact versions of python/requirements.txt. It is
# outside the build directories, so make clean keeps it; it is made again when that file
# changes, and pip's wheel cache (~/.cache/pip) serves every later install without a download.
# The file is the whole closure, installed with --no-deps (its header says why).
# `make venv` makes it alone.
VENV ?= $(CURDIR)/.venv
VENV_PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.requirements

$(VENV_STAMP): python/requirements.txt | $(DEPS_STAMP)
	$(call say,VENV,$(VENV))
	$(Q)if ! cmp -s $< $@; then \
	  { [ -x $(VENV_PY) ] || $(PYTHON) -m venv $(VENV); } && \
	  $(VENV_PY) -m pip install --quiet --disable-pip-version-check --no-input --use-pep517 \
	    --no-deps -r $< && \
	  cp $< $@; \
	else touch $@; fi

venv: $(VENV_STAMP)

# A wheel of the package, built by pip from python/ against this build (python/setup.py), into
# $(BUILD)/dist/.
WHEEL_DIR := $(BUILD)/dist
wheel: $(VENV_STAMP) $(PY_SETUP_JSON) $(LIBVASE_DIST_A) $(PUBLIC_STAMP)
	$(call say,WHEEL,$(WHEEL_DIR))
	$(Q)mkdir -p $(WHEEL_DIR) && VASE_BUILD_DIR=$(abspath $(BUILD)) $(VENV_PY) -m pip wheel \
	  --quiet --disable-pip-version-check --no-deps --no-build-isolation -w $(WHEEL_DIR) ./python

.PHONY: venv wheel

# ---- daemon/: vased -------------------------------------------------------------------

DAEMON_SRCS := $(filter-out $(CUDA_ARENA_EXCLUDED),$(wildcard daemon/*.c daemon/*/*.c))
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(BUILD)/%.o)
# The daemon's folders are its layers (tests/check_layers.sh): a file names a header of another
# folder by its folder ("core/registry.h"), found through -Idaemon; the unit tests do the same.
$(BUILD)/daemon/%.o $(BUILD)/tests/%.o: CPPFLAGS += -Idaemon
DAEMON_LIB := $(BUILD)/libvased.a
VASED := $(BUILD)/vased
DAEMON_LIBS := $(ZMQ_LIBS) $(PROTOBUF_LIBS) $(SYSTEMD_LIBS) $(INIH_LIBS) $(MHD_LIBS) $(BLAS_LIBS) -lm \
               $(DAEMON_CUDA_LIBS)

# Everything but main() goes into an archive the unit tests link against.
$(DAEMON_LIB): $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJS)) $(PROTO_OBJ) $(WIRE_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

# The core layer alone (daemon/core/, the objects that never see struct vased): the unit tests
# of its modules link this archive and no other layer of vased, so a core module that reaches
# into a layer above fails to link (tests/check_layers.sh checks the includes).
DAEMON_CORE_LIB := $(BUILD)/libvased_core.a
DAEMON_CORE_TESTS := $(addprefix $(BUILD)/tests/test_daemon_, \
                       admitq alloc allow arena balance log registry session)
$(DAEMON_CORE_LIB): $(filter $(BUILD)/daemon/core/%,$(DAEMON_OBJS)) $(PROTO_OBJ) $(WIRE_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(VASED): $(BUILD)/daemon/main.o $(DAEMON_LIB) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(DAEMON_LIBS)

# ---- examples/ ------------------------------------------------------------------------

# Each example is one program: examples/NAME.c, and when it is longer than a file, the files
# examples/NAME_*.c beside it, which share their declarations in examples/NAME.h.
EXAMPLE_NAMES := synthetic_engine reopen_engine loadgen
EXAMPLES := $(EXAMPLE_NAMES:%=$(BUILD)/examples/%)
example_parts = $(wildcard examples/$(1)_*.c)
EXAMPLE_SRCS := $(foreach n,$(EXAMPLE_NAMES),examples/$(n).c $(call example_parts,$(n)))
EXAMPLE_HEADERS := $(wildcard examples/*.h)

# The examples are engines written against the public API alone: they see only the public
# headers (PUBLIC_INCLUDE, below) and link only libvase.
$(BUILD)/examples/%.o: CPPFLAGS := -D_GNU_SOURCE -MMD -MP -I$(PUBLIC_INCLUDE)
$(EXAMPLE_SRCS:examples/%.c=$(BUILD)/examples/%.o): | $(PUBLIC_STAMP)

$(EXAMPLES): $(BUILD)/examples/%: $(BUILD)/examples/%.o $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) $(LIBVASE_LIBS)
$(foreach n,$(EXAMPLE_NAMES),$(eval $(BUILD)/examples/$(n): \
  $(patsubst examples/%.c,$(BUILD)/examples/%.o,$(call example_parts,$(n)))))

# ---- tests/ ---------------------------------------------------------------------------

KERNEL_MODULES := view philox select score plan compact attend
# plan.c's protected prompt has a binary of its own (test_plan_prompt).
KERNEL_TESTS := $(KERNEL_MODULES:%=$(BUILD)/tests/test_%) $(BUILD)/tests/test_plan_prompt
TEST_SUPPORT_OBJS := $(BUILD)/tests/npy.o $(BUILD)/tests/vcase.o $(BUILD)/tests/argnum.o
REPLAY_ENGINE := $(BUILD)/tests/replay_engine
RUN_VECTORS := $(BUILD)/tests/run_vectors
BENCH_KERNELS := $(BUILD)/tests/bench_kernels
# Daemon module tests link the daemon archive; client tests libvase; integration tests start a
# real vased and use the real library.
DAEMON_TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%, \
                  $(filter-out $(CUDA_ARENA_TEST_SRCS),$(wildcard tests/test_daemon_*.c)))
CLIENT_TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%, \
                  $(filter-out $(CUDA_ARENA_TEST_SRCS),$(wildcard tests/test_client_*.c)))
INTEGRATION_TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_integration_*.c))
# The public API test, built twice: against libvase.a with its libraries, and against libvase.so.
PUBLIC_API_TESTS := $(BUILD)/tests/test_public_api_static $(BUILD)/tests/test_public_api_shared
TEST_PROGS := $(KERNEL_TESTS) $(DAEMON_TESTS) $(CLIENT_TESTS) $(INTEGRATION_TESTS) \
              $(CUDA_ARENA_TESTS) $(PUBLIC_API_TESTS)

# The planner's test fixture (tests/plan_fixture.c) is linked into every daemon test.
# test_daemon_evictor gives one fake arena a planner of its own by wrapping vase_planner_for.
$(BUILD)/tests/test_daemon_evictor: private LDFLAGS += -Wl,--wrap=vase_planner_for
$(filter-out $(DAEMON_CORE_TESTS),$(DAEMON_TESTS)): $(BUILD)/tests/%: $(BUILD)/tests/%.o \
                                   $(BUILD)/tests/plan_fixture.o $(DAEMON_LIB) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(TEST_WRAP) -o $@ $^ -lcmocka $(DAEMON_LIBS)

$(DAEMON_CORE_TESTS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(DAEMON_CORE_LIB) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(TEST_WRAP) -o $@ $^ -lcmocka $(DAEMON_LIBS)

# The allocation-failure sweeps route the allocator calls of the daemon archive, the kernels and
# the test itself through the test's wrappers, which fail the Nth allocation of a sweep step.
ALLOC_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=aligned_alloc \
              -Wl,--wrap=free
$(BUILD)/tests/test_daemon_alloc_fail: TEST_WRAP := $(ALLOC_WRAP)
$(BUILD)/tests/test_daemon_alloc_fail: $(BUILD)/tests/alloc_fail.o
# The drop-in writer's failures: write(2) and mkostemp(3) fail on demand.
$(BUILD)/tests/test_daemon_config_dropin: TEST_WRAP := -Wl,--wrap=write,--wrap=mkostemp
$(BUILD)/tests/test_daemon_config_dropin: $(BUILD)/tests/log_capture.o
# test_daemon_restore checks the reasons vased logs for a kept arena it discards.
$(BUILD)/tests/test_daemon_restore: $(BUILD)/tests/log_capture.o

# vased with the allocation-failure hook, armed on its main thread once it is ready
# (tests/vased_alloc_fail.c); test_integration_alloc_fail starts it. Only for the tests.
VASED_ALLOC_FAIL := $(BUILD)/tests/vased_alloc_fail
$(VASED_ALLOC_FAIL): $(BUILD)/daemon/main.o $(BUILD)/tests/vased_alloc_fail.o \
                     $(BUILD)/tests/alloc_fail.o $(DAEMON_LIB) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(ALLOC_WRAP) -Wl,--wrap=sd_notify -o $@ $^ -lcmocka $(DAEMON_LIBS)

$(CLIENT_TESTS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(TEST_WRAP) -o $@ $^ -lcmocka $(LIBVASE_LIBS)

$(BUILD)/tests/test_client_alloc_fail: TEST_WRAP := $(ALLOC_WRAP)
$(BUILD)/tests/test_client_alloc_fail: $(BUILD)/tests/alloc_fail.o

# The integration harness (start and stop a real vased, run helper programs) is shared by the
# integration tests.
INTEGRATION_SUPPORT_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/integration/*.c))

$(INTEGRATION_TESTS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(INTEGRATION_SUPPORT_OBJS) $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(TEST_WRAP) -o $@ $^ -lcmocka $(LIBVASE_LIBS)

# libvase's sweep against a real daemon: only the test process's allocations are wrapped.
$(BUILD)/tests/test_integration_alloc_fail: TEST_WRAP := $(ALLOC_WRAP)
$(BUILD)/tests/test_integration_alloc_fail: $(BUILD)/tests/alloc_fail.o
$(BUILD)/tests/test_integration_alloc_fail: | $(VASED_ALLOC_FAIL)

# Integration tests need the programs they start.
$(INTEGRATION_TESTS): | $(VASED) $(VASECTL) $(EXAMPLES) $(REPLAY_ENGINE)

# An engine's view of libvase: the test sees only the staged public headers (no -Ikernels,
# -Iclient or -Iproto), as an engine built elsewhere would.
$(BUILD)/tests/test_public_api.o: CPPFLAGS := -D_GNU_SOURCE -MMD -MP -I$(PUBLIC_INCLUDE)
$(BUILD)/tests/test_public_api.o: | $(PUBLIC_STAMP)

$(BUILD)/tests/test_public_api_static: $(BUILD)/tests/test_public_api.o $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LIBVASE_LIBS)

$(BUILD)/tests/test_public_api_shared: $(BUILD)/tests/test_public_api.o $(LIBVASE_SO).$(LIBVASE_SOVERSION)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< -L$(BUILD) -Wl,-rpath,$(abspath $(BUILD)) -lvase -lcmocka

# The replay engine (tests/replay_engine.c) replays the reference traces through a running vased;
# an end-to-end test, not an example, so it may use the test support code.
$(REPLAY_ENGINE): $(BUILD)/tests/replay_engine.o $(TEST_SUPPORT_OBJS) $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBVASE_LIBS)

$(KERNEL_TESTS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(BLAS_LIBS) $(LIBM)

$(RUN_VECTORS): $(BUILD)/tests/run_vectors.o $(TEST_SUPPORT_OBJS) $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(BLAS_LIBS) $(LIBM)

$(BENCH_KERNELS): $(BUILD)/tests/bench_kernels.o $(BUILD)/tests/argnum.o $(KERNEL_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(BLAS_LIBS) $(LIBM)

# The engine program of the README (the C block after its "make check extracts" comment), built
# exactly as the README says an engine is built: the public headers and libvase.a.
README_ENGINE := $(BUILD)/tests/readme_engine
$(BUILD)/tests/readme_engine.c: README.md
	$(Q)mkdir -p $(@D)
	$(Q)awk '/make check extracts the next C block/ {want = 1; next} \
	  want && /^```c$$/ {inside = 1; next} inside && /^```$$/ {exit} inside {print}' $< >$@.tmp && \
	  test -s $@.tmp && mv $@.tmp $@
$(README_ENGINE): $(BUILD)/tests/readme_engine.c $(LIBVASE_A) | $(PUBLIC_STAMP)
	$(call say,LD,$@)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -I$(PUBLIC_INCLUDE) -o $@ $< $(LIBVASE_A) $(LIBVASE_LIBS)

# ---- run, demo, systemd (examples/systemd owner) ----

# make run: vased in the foreground on the host arena, its sockets in ./run (RUN_DIR);
# RUN_FLAGS adds settings (RUN_FLAGS=--arena-bytes=1G). No configuration file is read; the
# drop-ins, and what `vasectl config set --persist` writes, are in RUN_DIR/vased.conf.d.
RUN_DIR ?= $(CURDIR)/run
RUN_FLAGS ?=
SYNTHETIC_ENGINE := $(BUILD)/examples/synthetic_engine
BENCH_SERVICE := $(BUILD)/tests/bench_service
WITH_VASED := examples/with_vased.sh
REPLAY_VECTORS := $(BUILD)/vectors-replay

$(BENCH_SERVICE): $(BUILD)/tests/bench_service.o $(BUILD)/tests/argnum.o $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBVASE_LIBS)

BENCH_TENANTS := $(BUILD)/tests/bench_tenants

$(BENCH_TENANTS): $(BUILD)/tests/bench_tenants.o $(BUILD)/tests/argnum.o $(LIBVASE_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBVASE_LIBS)

# The service benchmarks are built with everything else, so that it cannot rot; it runs only on
# demand (make bench-service).
all: $(if $(LIBVASE_SRCS),$(BENCH_SERVICE) $(BENCH_TENANTS))

run: $(VASED) $(VASECTL) $(EXAMPLES)
	$(Q)mkdir -p $(RUN_DIR)
	@echo "vased: host arena, sockets in $(RUN_DIR); Ctrl-C stops it. From another shell:"
	@echo "  $(SYNTHETIC_ENGINE) --runtime-dir=$(RUN_DIR) --seqs=2 --duration=30"
	@echo "  VASE_RUNTIME_DIR=$(RUN_DIR) $(VASECTL) status    (also: clients, seqs, config)"
	$(Q)VASE_RUNTIME_DIR=$(RUN_DIR) exec $(VASED) --config=/dev/null --runtime-dir=$(RUN_DIR) \
	  --config-dir=$(RUN_DIR)/vased.conf.d $(RUN_FLAGS)

# Two engines of different models share one private daemon; nothing is left running.
demo: $(VASED) $(VASECTL) $(SYNTHETIC_ENGINE)
	$(Q)$(WITH_VASED) $(VASED) --arena-bytes=256M -- examples/demo.sh $(SYNTHETIC_ENGINE) $(VASECTL)

# The reference traces, shipped and generated, replayed through a private daemon with pages of
# 1, 16 and 256 tokens (the engine under TEST_WRAPPER, so check-valgrind covers it).
check-replay: $(VASED) $(REPLAY_ENGINE)
	$(Q)rm -rf $(REPLAY_VECTORS) && $(PYTHON) tests/vectors/gen_vectors.py $(REPLAY_VECTORS) >/dev/null
	$(Q)$(WITH_VASED) $(VASED) -- $(TEST_WRAPPER) $(REPLAY_ENGINE) --block=1,16,256 \
	  $$(ls -d $(VECTORS)/trace_*/ $(REPLAY_VECTORS)/trace_*/)

# The unit, sysusers and tmpfiles files parse, and vased.conf is what the daemon dumps.
check-systemd: $(VASED) $(VASECTL)
	$(Q)systemd/check.sh $(VASED)

# Rewrites systemd/vased.conf after a change to the daemon's settings table.
update-vased-conf: $(VASED)
	$(Q)$(VASED) --config=/dev/null --dump-config >systemd/vased.conf

bench-service: $(VASED) $(BENCH_SERVICE)
	$(Q)VASED=$(VASED) BENCH=$(BENCH_SERVICE) tests/bench_service.sh

# One uid's victim session beside 32 sessions of another uid (as root).
bench-tenants: $(VASED) $(BENCH_TENANTS)
	$(Q)VASED=$(VASED) BENCH=$(BENCH_TENANTS) tests/bench_tenants.sh $(BENCH_TENANTS_FLAGS)

.PHONY: run demo check-replay check-systemd update-vased-conf bench-service bench-tenants

# ---- end run, demo, systemd ----

# ---- install, man pages, deb ----
#
# make install [PREFIX=/usr/local] [DESTDIR=]: vased and vasectl in BINDIR (vased.service's
# ExecStart names $(BINDIR)/vased: /usr/bin/vased with PREFIX=/usr, as the unit in systemd/
# says); libvase.so.$(VERSION) with its SONAME link libvase.so.$(LIBVASE_SOVERSION) and the
# link libvase.so, libvase.a and vase.pc in LIBDIR; the public headers in $(INCLUDEDIR)/vase;
# the unit, sysusers and tmpfiles files under $(LIBDIR)/ (systemd reads both /usr/lib and
# /usr/local/lib); the man pages (when scdoc is installed); the Python package; and
# /etc/vase/vased.conf only if there is none: an operator's copy is never overwritten; the
# drop-in directory /etc/vase/vased.conf.d. `make uninstall` removes the same files, vased.conf
# only while it is the default, and the drop-in directory only while it is empty.
# `make deb` packages `make install PREFIX=/usr` (build/debs/, below). The version is
# the daemon's (VERSION, above); the SONAME changes only when the ABI breaks.

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
DOCDIR ?= $(PREFIX)/share/doc/vase
# The documentation beside the README, installed as DOCDIR/docs/ so that the README's links hold.
DOC_FILES := $(wildcard docs/*.md)
SYSCONFDIR ?= /etc
PYTHONDIR ?= $(PREFIX)/lib/python3/dist-packages
UNITDIR ?= $(LIBDIR)/systemd/system
SYSUSERSDIR ?= $(LIBDIR)/sysusers.d
TMPFILESDIR ?= $(LIBDIR)/tmpfiles.d

# ---- man pages (man/*.scd; vased.conf(5) generated from `vased --dump-config`) ----

MAN_DIR := $(BUILD)/man
MAN_PAGES := $(MAN_DIR)/vased.8 $(MAN_DIR)/vasectl.1 $(MAN_DIR)/libvase.3 $(MAN_DIR)/vased.conf.5
HAVE_SCDOC := $(if $(shell command -v scdoc 2>/dev/null),1,0)

$(MAN_DIR)/%: man/%.scd | $(DEPS_STAMP)
	$(call say,SCDOC,$@)
	$(Q)mkdir -p $(@D)
	$(Q)scdoc <$< >$@.tmp && mv $@.tmp $@

$(MAN_DIR)/vased.conf.5: man/vased.conf.5.awk $(VASED)
	$(call say,SCDOC,$@)
	$(Q)mkdir -p $(@D)
	$(Q)env -u VASE_RUNTIME_DIR -u RUNTIME_DIRECTORY $(VASED) --config=/dev/null --dump-config \
	  >$@.dump && awk -f $< $@.dump >$@.scd && scdoc <$@.scd >$@.tmp && mv $@.tmp $@

ifeq ($(HAVE_SCDOC),1)
man: $(MAN_PAGES)
all: man
else
MAN_PAGES :=
man:
	@echo "  SKIP    man pages: no scdoc (make deps installs it)"
all: man
endif

# ---- pkg-config ----

# Rewritten on every make, replaced only when its text changes (another PREFIX, LIBDIR, ...).
VASE_PC := $(BUILD)/vase.pc
$(VASE_PC): FORCE | $(DEPS_STAMP)
	$(Q)printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: vase' 'Description: Client library of vased, the vase KV-cache daemon' \
	  'Version: $(VERSION)' 'Requires: libprotobuf-c' 'Requires.private: libzmq' \
	  'Cflags: -I$${includedir}/vase' 'Libs: -L$${libdir} -lvase' \
	  'Libs.private: $(LIBVASE_DIST_LIBS)' '' \
	  '# What a link of libvase.a alone needs besides Libs (pkg-config --variable=static_libs vase):' \
	  '# --static would also add the private libraries of libzmq, which need its own static build.' \
	  'static_libs=-lzmq $(LIBVASE_DIST_LIBS)' >$@.tmp
	$(Q)if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

# ---- install, uninstall ----

INSTALL ?= install
INSTALL_DEPS := $(VASED) $(VASECTL) $(LIBVASE_SO) $(LIBVASE_DIST_A) $(PUBLIC_STAMP) $(VASE_PC) \
                $(if $(filter 1,$(HAVE_PY_HEADERS)),$(PY_EXT) $(PY_STAGED)) $(PY_ENTRY_POINTS) \
                $(MAN_PAGES)
LIBVASE_FILE := libvase.so.$(VERSION)
LIBVASE_SONAME := libvase.so.$(LIBVASE_SOVERSION)
D := $(DESTDIR)

install: $(INSTALL_DEPS)
	$(call say,INSTALL,$(D)$(PREFIX))
	$(Q)$(INSTALL) -d $(D)$(BINDIR) $(D)$(LIBDIR)/pkgconfig $(D)$(INCLUDEDIR)/vase $(D)$(UNITDIR) \
	  $(D)$(SYSUSERSDIR) $(D)$(TMPFILESDIR) $(D)$(SYSCONFDIR)/vase $(D)$(DOCDIR)/docs \
	  $(D)$(SYSCONFDIR)/vase/vased.conf.d
	$(Q)$(INSTALL) -m 755 $(VASED) $(VASECTL) $(D)$(BINDIR)/
	$(Q)$(INSTALL) -m 644 $(LIBVASE_SO) $(D)$(LIBDIR)/$(LIBVASE_FILE)
	$(Q)ln -sf $(LIBVASE_FILE) $(D)$(LIBDIR)/$(LIBVASE_SONAME)
	$(Q)ln -sf $(LIBVASE_SONAME) $(D)$(LIBDIR)/libvase.so
	$(Q)$(INSTALL) -m 644 $(LIBVASE_DIST_A) $(D)$(LIBDIR)/libvase.a
	$(Q)$(INSTALL) -m 644 $(VASE_PC) $(D)$(LIBDIR)/pkgconfig/
	$(Q)$(INSTALL) -m 644 $(addprefix $(PUBLIC_INCLUDE)/,$(notdir $(PUBLIC_HEADERS))) \
	  $(D)$(INCLUDEDIR)/vase/
	$(Q)sed -e 's|^ExecStart=/usr/bin/vased |ExecStart=$(BINDIR)/vased |' \
	  -e 's|^ExecReload=/usr/bin/vasectl |ExecReload=$(BINDIR)/vasectl |' systemd/vased.service \
	  >$(D)$(UNITDIR)/vased.service && chmod 644 $(D)$(UNITDIR)/vased.service
	$(Q)$(INSTALL) -m 644 systemd/vased.socket $(D)$(UNITDIR)/
	$(Q)$(INSTALL) -m 644 systemd/vase.sysusers $(D)$(SYSUSERSDIR)/vase.conf
	$(Q)$(INSTALL) -m 644 systemd/vase.tmpfiles $(D)$(TMPFILESDIR)/vase.conf
	$(Q)[ -e $(D)$(SYSCONFDIR)/vase/vased.conf ] || \
	  $(INSTALL) -m 644 systemd/vased.conf $(D)$(SYSCONFDIR)/vase/vased.conf
	$(Q)$(INSTALL) -m 644 README.md $(D)$(DOCDIR)/
	$(Q)$(INSTALL) -m 644 $(DOC_FILES) $(D)$(DOCDIR)/docs/
	$(Q)for p in $(MAN_PAGES); do s=$${p##*.}; \
	  $(INSTALL) -d $(D)$(MANDIR)/man$$s && $(INSTALL) -m 644 $$p $(D)$(MANDIR)/man$$s/ || exit 1; \
	done
	$(Q)$(INSTALL) -d $(D)$(PYTHONDIR)/vase && $(INSTALL) -m 644 $(PY_FILES) $(D)$(PYTHONDIR)/vase/
	$(Q)$(INSTALL) -d $(D)$(PYTHONDIR)/vase/vllm && \
	  $(INSTALL) -m 644 $(PY_VLLM_FILES) $(D)$(PYTHONDIR)/vase/vllm/
	$(Q)$(INSTALL) -d $(D)$(PYTHONDIR)/$(PY_DIST_INFO) && \
	  $(INSTALL) -m 644 $(PY_ENTRY_POINTS) $(dir $(PY_ENTRY_POINTS))METADATA \
	    $(D)$(PYTHONDIR)/$(PY_DIST_INFO)/
	$(Q)if [ -f $(PY_EXT) ]; then $(INSTALL) -m 644 $(PY_EXT) $(D)$(PYTHONDIR)/vase/; \
	else echo "  SKIP    $(PY_EXT): not built (python3-dev, libdlpack-dev)"; fi

# Every file install may have written (man pages whether or not they were built), vased.conf
# only while it is the default one, then the directories of ours that are left empty.
INSTALLED_FILES = $(addprefix $(BINDIR)/,vased vasectl) \
  $(addprefix $(LIBDIR)/,$(LIBVASE_FILE) $(LIBVASE_SONAME) libvase.so libvase.a pkgconfig/vase.pc) \
  $(addprefix $(INCLUDEDIR)/vase/,$(notdir $(PUBLIC_HEADERS))) $(UNITDIR)/vased.service \
  $(UNITDIR)/vased.socket $(SYSUSERSDIR)/vase.conf $(TMPFILESDIR)/vase.conf $(DOCDIR)/README.md \
  $(addprefix $(DOCDIR)/,$(DOC_FILES)) \
  $(MANDIR)/man8/vased.8 $(MANDIR)/man1/vasectl.1 $(MANDIR)/man3/libvase.3 \
  $(MANDIR)/man5/vased.conf.5 \
  $(addprefix $(PYTHONDIR)/vase/,$(notdir $(PY_FILES) $(PY_EXT))) \
  $(addprefix $(PYTHONDIR)/vase/vllm/,$(notdir $(PY_VLLM_FILES))) \
  $(addprefix $(PYTHONDIR)/$(PY_DIST_INFO)/,METADATA entry_points.txt)

uninstall:
	$(call say,REMOVE,$(D)$(PREFIX))
	$(Q)rm -f $(addprefix $(D),$(INSTALLED_FILES))
	$(Q)rm -rf $(D)$(PYTHONDIR)/vase/__pycache__ $(D)$(PYTHONDIR)/vase/vllm/__pycache__
	$(Q)if cmp -s systemd/vased.conf $(D)$(SYSCONFDIR)/vase/vased.conf; then \
	  rm -f $(D)$(SYSCONFDIR)/vase/vased.conf; \
	elif [ -e $(D)$(SYSCONFDIR)/vase/vased.conf ]; then \
	  echo "  KEEP    $(D)$(SYSCONFDIR)/vase/vased.conf (edited)"; fi
	$(Q)rmdir $(D)$(INCLUDEDIR)/vase $(D)$(DOCDIR)/docs $(D)$(DOCDIR) $(D)$(PYTHONDIR)/vase/vllm \
	  $(D)$(PYTHONDIR)/vase $(D)$(PYTHONDIR)/$(PY_DIST_INFO) \
	  $(D)$(SYSCONFDIR)/vase/vased.conf.d $(D)$(SYSCONFDIR)/vase 2>/dev/null || true

# ---- deb ----
#
# `make deb`: the tree `make install PREFIX=/usr` writes, split into vase's Debian packages by
# packaging/deb/build-debs.sh (vased, libvase$(LIBVASE_SOVERSION), libvase-dev, python3-vase, and
# vase, which depends on the four), each with its Depends from dpkg-shlibdeps, in DEB_DIR. It
# builds every file it packages first, the Python extension included, from this build's objects
# and flags (another USE_CUDA or OPT rebuilds them, see FLAGS_FILE), so a package never holds a
# file left from another build. The CUDA runtime is linked statically: the same packages run
# on hosts with and without the NVIDIA driver, which a CUDA arena needs.
DEB_ARCH = $(shell dpkg --print-architecture 2>/dev/null)
DEB_STAGE := $(BUILD)/deb-stage
DEB_DIR := $(BUILD)/debs
DEB_NAMES := vased libvase$(LIBVASE_SOVERSION) libvase-dev python3-vase vase
DEBS = $(DEB_NAMES:%=$(DEB_DIR)/%_$(VERSION)_$(DEB_ARCH).deb)
# Who the packages name as their maintainer, and the date of their changelog entries (the last
# commit's, so that two builds of one commit give the same packages).
DEB_MAINTAINER ?= vase developers <vase@localhost>
DEB_DATE = $(or $(SOURCE_DATE_EPOCH),$(shell git log -1 --format=%ct 2>/dev/null),0)
# The example engines libvase-dev ships, and what a static link of its libvase.a needs besides
# vase.pc's Requires (the C++ runtime of the CUDA code inside).
DEB_EXAMPLES := $(EXAMPLE_SRCS) $(EXAMPLE_HEADERS)
DEB_DEV_DEPENDS := $(if $(filter 1,$(HAVE_CUDA)),libstdc++-12-dev | libstdc++-dev)

ifeq ($(HAVE_PY_HEADERS),1)
deb: $(INSTALL_DEPS) $(PY_EXT) $(PY_STAGED) $(PY_ENTRY_POINTS)
else
deb:
	@echo "error: make deb packages the Python extension, which needs Python.h and dlpack/dlpack.h" \
	  "for $(PYTHON) (python3-dev, libdlpack-dev)$(if $(SANITIZE),; and a build without SANITIZE)" >&2; exit 1
endif
ifeq ($(HAVE_PY_HEADERS),1)
	$(Q)rm -rf $(DEB_STAGE) $(DEB_DIR)
	$(Q)$(MAKE) --no-print-directory install DESTDIR=$(abspath $(DEB_STAGE)) PREFIX=/usr
	$(Q)VERSION='$(VERSION)' ARCH='$(DEB_ARCH)' MAINTAINER='$(DEB_MAINTAINER)' DATE='$(DEB_DATE)' \
	  SOVERSION='$(LIBVASE_SOVERSION)' EXAMPLES='$(DEB_EXAMPLES)' \
	  EXAMPLES_MK=packaging/deb/examples.mk LICENSE=LICENSE \
	  PACKAGING=packaging/deb DEV_DEPENDS='$(DEB_DEV_DEPENDS)' \
	  packaging/deb/build-debs.sh $(DEB_STAGE) $(DEB_DIR)
	$(Q)rm -rf $(DEB_STAGE)
endif

# The install and uninstall rules, the pkg-config file against the staged tree, the man pages
# and the package's contents (tests/test_install.sh).
check-install: all
	$(Q)MAKE="$(MAKE)" BUILD=$(BUILD) tests/test_install.sh

.PHONY: man install uninstall deb check-install

# ---- end install, man pages, deb ----

# ---- check-boot (tests/check_boot.sh) ----
#
# `make check-boot` (as root; not part of `make check`): the packages of `make deb` installed in
# a Debian 12 root without any CUDA library that systemd-nspawn boots, checked from inside under
# a real systemd (tests/boot/checks.sh). Its tools come from systemd-container and mmdebstrap, installed on
# demand like the build's packages. The engine it runs is the synthetic engine linked against
# libvase.so, so that it takes the installed library; examples/reopen_engine checks a restart
# that keeps the arena.
BOOT_DEB_PACKAGES := systemd-container mmdebstrap
BOOT_ENGINE := $(BUILD)/boot/synthetic_engine
BOOT_REOPEN_ENGINE := $(filter %/reopen_engine,$(EXAMPLES))

$(BOOT_ENGINE): $(patsubst examples/%.c,$(BUILD)/examples/%.o,examples/synthetic_engine.c \
                 $(call example_parts,synthetic_engine)) $(LIBVASE_SO).$(LIBVASE_SOVERSION)
	$(call say,LD,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) -L$(BUILD) -lvase -lm

check-boot-deps: DEB_PACKAGES := $(BOOT_DEB_PACKAGES)
check-boot-deps:
	$(Q)$(APT_INSTALL_SH)

# With CUDA, the packages of a build without it (in $(BOOT_PLAIN_BUILD), USE_CUDA=0) are checked
# in the same root first: installed, loaded (ldd, import vase) and purged.
BOOT_PLAIN_BUILD := $(BUILD)-plain

check-boot: check-boot-deps deb $(BOOT_ENGINE) $(BOOT_REOPEN_ENGINE)
ifeq ($(HAVE_CUDA),1)
	$(Q)$(MAKE) --no-print-directory deb BUILD=$(BOOT_PLAIN_BUILD) USE_CUDA=0
	$(Q)tests/check_boot.sh $(DEB_DIR) $(BOOT_ENGINE) $(BOOT_REOPEN_ENGINE) -- $(BOOT_PLAIN_BUILD)/debs
else
	$(Q)tests/check_boot.sh $(DEB_DIR) $(BOOT_ENGINE) $(BOOT_REOPEN_ENGINE)
endif

# The packages of `make` and of `make check-boot`, one line each; tests/test_setup.sh compares
# them with the README's tables. Installs nothing and needs no configuration.
print-deb-packages:
	@echo "make: $(DEB_PACKAGES)"
	@echo "check-boot: $(BOOT_DEB_PACKAGES)"

.PHONY: check-boot check-boot-deps print-deb-packages

# ---- end check-boot ----

# ---- generic rules --------------------------------------------------------------------

$(BUILD)/kernels/%.o: kernels/%.c $(FLAGS_FILE) | $(DEPS_STAMP)
	$(call say,CC,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.c $(FLAGS_FILE) | $(DEPS_STAMP) $(GENERATED_HEADERS)
	$(call say,CC,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

ALL := $(KERNEL_LIB) $(TEST_PROGS) $(RUN_VECTORS) $(BENCH_KERNELS) \
       $(if $(DAEMON_SRCS),$(VASED)) $(if $(LIBVASE_SRCS),$(LIBVASE_A) $(LIBVASE_SO)) \
       $(if $(VASECTL_SRCS),$(VASECTL)) $(EXAMPLES) $(REPLAY_ENGINE) $(README_ENGINE)

all: $(ALL)

GEN_VECTORS := $(BUILD)/vectors-gen
# The block sizes (tokens per page) that check runs every vector with, after the contiguous run.
VECTOR_BLOCKS ?= 1,16,256
# The integration harness starts the programs of this build; replay_engine's test replays the
# traces of VECTORS.
export VASE_BUILD_DIR := $(abspath $(BUILD))
export VASE_VECTORS := $(abspath $(VECTORS))

# vase.proto keeps the ABI of the released schema (proto/abi_check.py), and the checker refuses
# what it must (tests/test_proto_abi.sh). Needs nothing built.
check-proto-abi:
	$(Q)tests/test_proto_abi.sh

# Runs every unit-test binary, the include check of vased's layers (tests/check_layers.sh),
# the Makefile's own set-up checks, the ABI rule of vase.proto, the
# vector runner on the shipped vectors and on cases generated by the independent NumPy
# implementation (K and V contiguous, then in pages of each of VECTOR_BLOCKS tokens), and ends
# with one "check: N passed, N failed" line.
check: all $(VENV_STAMP)
	$(Q)pass=0; fail=0; \
	result() { if [ "$$1" = 0 ]; then pass=$$((pass + 1)); else fail=$$((fail + 1)); echo "FAILED: $$2" >&2; fi; }; \
	for t in $(TEST_PROGS); do \
	  echo "  TEST    $$t"; $(TEST_WRAPPER) $$t; result $$? $$t; \
	done; \
	echo "  LAYERS  tests/check_layers.sh"; tests/check_layers.sh; result $$? tests/check_layers.sh; \
	echo "  SETUP   tests/test_setup.sh"; tests/test_setup.sh; result $$? tests/test_setup.sh; \
	echo "  PROTO   tests/test_proto_abi.sh: vase.proto against the released schema"; \
	  tests/test_proto_abi.sh; result $$? tests/test_proto_abi.sh; \
	echo "  LINKS   tests/check_links.py: README.md and docs/*.md"; $(PYTHON) tests/check_links.py; \
	  result $$? tests/check_links.py; \
	echo "  SOCKET  tests/test_sd_emu.sh"; BUILD=$(BUILD) tests/test_sd_emu.sh; \
	  result $$? tests/test_sd_emu.sh; \
	if [ -z "$(SANITIZE)" ]; then \
	  echo "  INSTALL tests/test_install.sh"; MAKE="$(MAKE)" BUILD=$(BUILD) tests/test_install.sh; \
	  result $$? tests/test_install.sh; \
	else echo "  SKIP    tests/test_install.sh: a sanitizer build is not what gets installed (its programs need the sanitizer runtime first)"; fi; \
	echo "  VECTORS $(VECTORS)"; \
	if [ -d "$(VECTORS)" ]; then $(TEST_WRAPPER) $(RUN_VECTORS) $$(ls -d $(VECTORS)/*/); result $$? "vectors $(VECTORS)"; \
	  $(TEST_WRAPPER) $(RUN_VECTORS) --block=$(VECTOR_BLOCKS) $$(ls -d $(VECTORS)/*/); result $$? "vectors $(VECTORS) --block=$(VECTOR_BLOCKS)"; \
	else echo "error: no test vectors at $(VECTORS) (set VECTORS=DIR)" >&2; result 1 "vectors $(VECTORS)"; fi; \
	echo "  VECTORS generated by tests/vectors/gen_vectors.py"; \
	rm -rf $(GEN_VECTORS) && $(PYTHON) tests/vectors/gen_vectors.py $(GEN_VECTORS) >/dev/null && \
	  $(TEST_WRAPPER) $(RUN_VECTORS) $$(ls -d $(GEN_VECTORS)/*/); result $$? "generated vectors"; \
	[ -d $(GEN_VECTORS) ] && $(TEST_WRAPPER) $(RUN_VECTORS) --block=$(VECTOR_BLOCKS) $$(ls -d $(GEN_VECTORS)/*/); result $$? "generated vectors --block=$(VECTOR_BLOCKS)"; \
	echo "  SYSTEMD systemd/"; $(MAKE) --no-print-directory check-systemd; result $$? check-systemd; \
	echo "  REPLAY  traces through vased"; $(MAKE) --no-print-directory check-replay; result $$? check-replay; \
	echo "  README  the engine program, against a daemon with make run's settings"; \
	  $(WITH_VASED) $(VASED) -- $(README_ENGINE) >$(BUILD)/readme_engine.out 2>&1 && \
	  awk '/ evictions, / {found = $$1 > 0} END {exit !found}' $(BUILD)/readme_engine.out; \
	  rc=$$?; cat $(BUILD)/readme_engine.out; \
	  result $$rc "the README's engine"; \
	if [ "$(BUILD)" = build ]; then echo "  DOCS    the elastic budgets example of docs/engines.md"; \
	  tests/readme_elastic.sh; result $$? "the elastic budgets example of docs/engines.md"; fi; \
	echo "  TOP     tests/test_top_tmux.sh: vasectl top in a tmux terminal and into a pipe"; \
	  BUILD=$(BUILD) tests/test_top_tmux.sh; result $$? tests/test_top_tmux.sh; \
	echo "  LOADGEN examples/loadgen/run.sh --quick: static and elastic budgets, private daemon"; \
	  BUILD=$(BUILD) PYTHON=$(VENV_PY) examples/loadgen/run.sh --quick >$(BUILD)/loadgen-quick.out 2>&1; \
	  rc=$$?; tail -n 25 $(BUILD)/loadgen-quick.out; result $$rc "examples/loadgen/run.sh --quick"; \
	if [ -z "$(SANITIZE)" ]; then \
	  echo "  PYTHON  tests/python (pytest in $(VENV), python -X dev)"; \
	  PYTHONPATH=$(abspath $(BUILD))/python $(VENV_PY) -X dev -m pytest -q -p no:cacheprovider \
	    tests/python >$(BUILD)/pytest.out 2>&1; rc=$$?; cat $(BUILD)/pytest.out; \
	  summary=$$(tail -n 1 $(BUILD)/pytest.out); \
	  np=$$(echo "$$summary" | sed -n 's/.*\b\([0-9][0-9]*\) passed.*/\1/p'); \
	  nf=$$(echo "$$summary" | sed -n 's/.*\b\([0-9][0-9]*\) failed.*/\1/p'); \
	  ne=$$(echo "$$summary" | sed -n 's/.*\b\([0-9][0-9]*\) errors\{0,1\}.*/\1/p'); \
	  pass=$$((pass + $${np:-0})); fail=$$((fail + $${nf:-0} + $${ne:-0})); \
	  if [ $$rc != 0 ] && [ $$(($${nf:-0} + $${ne:-0})) = 0 ]; then result 1 "pytest tests/python (exit $$rc)"; fi; \
	  echo "  QUALITY examples/llm/harness.py --quick, against a private daemon"; \
	  $(WITH_VASED) $(VASED) -- $(VENV_PY) \
	    examples/llm/harness.py --quick --out $(BUILD)/quality-quick >$(BUILD)/quality-quick.out 2>&1; \
	  rc=$$?; tail -n 40 $(BUILD)/quality-quick.out; result $$rc "harness.py --quick"; \
	  echo "  QUALITY examples/llm/harness.py --quick --elastic-half: budgets halved mid-document"; \
	  $(WITH_VASED) $(VASED) -- $(VENV_PY) examples/llm/harness.py --quick --elastic-half \
	    --policies vase-attnv --out $(BUILD)/quality-elastic-quick \
	    >$(BUILD)/quality-elastic-quick.out 2>&1; \
	  rc=$$?; tail -n 20 $(BUILD)/quality-elastic-quick.out; result $$rc "harness.py --quick --elastic-half"; \
	else echo "  PYTHON  not run under SANITIZE (the extension is not built)"; fi; \
	echo "check: $$pass passed, $$fail failed"; [ $$fail = 0 ]

# The includes of daemon/ against its layers alone (make check runs it too).
check-layers:
	$(Q)tests/check_layers.sh

VALGRIND := valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
check-valgrind: all
	$(Q)$(MAKE) --no-print-directory check TEST_WRAPPER="$(VALGRIND)"

# The links of README.md and docs/*.md, and the README's length (also part of make check).
check-links:
	$(Q)$(PYTHON) tests/check_links.py

bench: $(BENCH_KERNELS)
	$(Q)BENCH=$(BENCH_KERNELS) tests/bench_table.sh

clean:
	$(Q)rm -rf $(BUILD) build build-san $(PY_SRC_DIR)/_vase.abi3.so

# The tree's C, CUDA and header files against .clang-format (Debian's clang-format); CI runs it.
# `make format` rewrites them in place.
FORMAT_FILES = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null)
format-check: | $(DEPS_STAMP)
	$(Q)clang-format --dry-run -Werror $(FORMAT_FILES) && echo "format-check: $(words $(FORMAT_FILES)) files follow .clang-format"

format: | $(DEPS_STAMP)
	$(Q)clang-format -i $(FORMAT_FILES)

.PHONY: all check check-layers check-links check-valgrind check-proto-abi bench clean deps format format-check
.DEFAULT_GOAL := all

-include $(shell find $(BUILD) -name '*.d' -type f 2>/dev/null)

# ---- the build's flags (FLAGS_FILE, above), now that every one of them is set ----
BUILD_FLAGS := CC=$(CC) CPPFLAGS=$(CPPFLAGS) CFLAGS=$(CFLAGS) LDFLAGS=$(LDFLAGS) \
               KERNEL_OPT=$(KERNEL_OPT) HAVE_CUDA=$(HAVE_CUDA) NVCC=$(NVCC) NVCCFLAGS=$(NVCCFLAGS) \
               CUDA_LIBS=$(CUDA_LIBS) BLAS_LIBS=$(BLAS_LIBS) SONAME=$(LIBVASE_SONAME)
BUILD_FLAGS_SUM := $(shell printf '%s\n' '$(subst ','\'',$(BUILD_FLAGS))' | cksum | cut -d' ' -f1)
