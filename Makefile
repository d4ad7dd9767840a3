# muser — the two commands. CMake + ctest do the work underneath.
#   make run    install missing Debian packages, build, generate text from the default model
#   make test   build and run the whole suite through ctest
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test test-asan test-tsan fuzz bench clean

all: build

deps:
	@./scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/muser run -n 120 --temp 0.7 --seed $(or $(SEED),4) -p "$(or $(PROMPT),The Lord is my shepherd;)"

# deps first: an existing build directory still gets the test-only packages (Chromium).
test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 1800

# ASan + UBSan build of the whole suite (CUDA off).
test-asan:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMUSER_SANITIZE=ON -DMUSER_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && MUSER_SANITIZED=1 ctest --output-on-failure -j $(JOBS) --timeout 3600

# ThreadSanitizer build of the concurrent tests (CUDA off): the engine, tensor-parallel ranks, and the
# server (its HTTP threads, slots and shutdown; split across two ranks too).
test-tsan:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DMUSER_TSAN=ON -DMUSER_CUDA=OFF
	cmake --build build-tsan -j $(JOBS) --target test_engine test_tp muser
	cd build-tsan && MUSER_SANITIZED=1 TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -R '^(engine|tp|cli_serve)$$' --timeout 1800

# A long libFuzzer run of the GGUF reader (clang); the short one is part of `make test`.
fuzz:
	./scripts/fuzz.sh --long

clean:
	rm -rf $(BUILD) build-asan build-tsan
