# The README's commands. Each does all set-up itself (scripts/setup.sh is quick when everything is installed).
#   make demo       the seed's scenario: 2 host processes x 4 virtual devices train a tiny Llama on the embedded
#                   corpus with global_batch_size=8 over ici_mesh.fsdp=4 x dcn_mesh.fsdp=2, every data stage logged
#   make test       every test (unit, multi-host, Python references)
#   make test-fast  the fast set (leaves out suites named *SlowTest)
BUILD_DIR ?= build
JOBS ?= 2
MESHTRAIN := $(BUILD_DIR)/meshtrain

.PHONY: setup build demo test test-fast clean

setup:
	@bash scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD_DIR)/build.ninja
	ninja -C $(BUILD_DIR) -j $(JOBS)
	bash scripts/prepare_default_shards.sh $(MESHTRAIN)

demo: build
	$(MESHTRAIN) run --hosts 2 --devices-per-host 4 -- train ici_mesh.fsdp=4 dcn_mesh.fsdp=2 global_batch_size=8 \
	  debug.data_shapes=true output_dir=outputs/demo checkpoint.resume=false

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

test-fast: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -E SlowTest

clean:
	rm -rf $(BUILD_DIR)
