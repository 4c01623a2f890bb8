# Thin wrapper over CMake: the commands a newcomer types.
#   make serve  - install dependencies, build, generate the demo model and serve the demo registry
#                 (models/demo.json: stories260K in two formats and the generated demo model) with
#                 the OpenAI-compatible API on http://127.0.0.1:8080 (MODEL=path.gguf for one model,
#                 REGISTRY=models.json or a directory of .gguf files for your own)
#   make run    - install dependencies, build, generate the demo model, generate text
#   make test   - build and run the whole suite, then the unit tests under ASan+UBSan,
#                 then each fuzz harness for a few seconds
#   make fuzz   - run each libFuzzer harness (tests/fuzz/) for FUZZ_SECONDS (default 60)

JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
DEMO_MODEL ?= demo/demo-q8_0.gguf
PROMPT ?= Once upon a time
MODEL ?=
REGISTRY ?= models/demo.json
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: all deps test-deps build asan fuzz-build fuzz run serve test demo clean

all: build

deps:
	@tools/install-deps.sh --no-npm

# npm test peers too: llama.cpp (node-llama-cpp) and the OpenAI client.
test-deps:
	@tools/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSB_SANITIZE=ON -DSB_WERROR=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# The harnesses, built by clang in a directory of their own (the main build is gcc).
# The GGUF harness's model seeds are generated (models stay out of the repository).
fuzz-build: deps build
	@mkdir -p $(FUZZ_BUILD)/seeds/gguf
	@$(BUILD)/switchboard gen-model --out $(FUZZ_BUILD)/seeds/gguf/tiny-llama-q8_0.gguf --type q8_0 --dim 32 --hidden 32 \
	    --layers 1 --heads 1 --kv-heads 1 --vocab 260 --ctx 64 --seed 1 >/dev/null
	@$(BUILD)/switchboard gen-model --out $(FUZZ_BUILD)/seeds/gguf/tiny-qwen2-q8_0.gguf --arch qwen2 --type q8_0 --dim 32 \
	    --hidden 32 --layers 1 --heads 2 --kv-heads 1 --vocab 260 --ctx 64 --seed 1 >/dev/null
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSB_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)

fuzz: fuzz-build
	@cmake $(FUZZ_BUILD) -DSB_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cd $(FUZZ_BUILD) && ctest --output-on-failure -L fuzz

$(DEMO_MODEL): | build
	@mkdir -p $(dir $(DEMO_MODEL))
	$(BUILD)/switchboard gen-model --out $(DEMO_MODEL) --type q8_0 --dim 256 --hidden 768 --layers 4 --heads 8 --kv-heads 4 --vocab 512 --ctx 1024 --seed 42

demo: build $(DEMO_MODEL)

run: demo
	$(BUILD)/switchboard run -m $(if $(MODEL),$(MODEL),$(DEMO_MODEL)) -p "$(PROMPT)" -n 64 --temp 0.8 --seed 1

serve: demo
	$(BUILD)/switchboard serve $(if $(MODEL),-m $(MODEL),--models $(REGISTRY)) --host $(HOST) --port $(PORT)

test: test-deps build asan fuzz-build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@grep -h "^SKIPPED:" $(BUILD)/Testing/Temporary/LastTest.log || true
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L 'unit|server'
	@cmake $(FUZZ_BUILD) -DSB_FUZZ_SECONDS=3 >/dev/null
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) -L fuzz

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) demo
