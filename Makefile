# flashlib: the course and its kernels. `make lab` to learn, `make test` to check everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Which torch to install (what `pip install` gets), and from where: TORCH_INDEX=auto takes PyTorch's
# CPU-only index on a machine without an NVIDIA driver and pip's default otherwise; `default` is pip's
# own configuration (e.g. a local wheel); or give an index URL. See tools/torch_choice.py.
TORCH  ?= torch
TORCH_INDEX ?= auto
NB     ?= exercises
# Extra flags for make bench-all, e.g. BENCH_ARGS="--dtype fp16" (see python -m flashlib.bench --help)
BENCH_ARGS ?=
PYTEST_NOTEBOOKS := notebooks solutions

.PHONY: FORCE help install lab test test-lib test-gpu test-notebooks test-browser advanced demo grade exercises bench bench-all bench-decode report gpu-info experiment clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

# A changed TORCH or TORCH_INDEX reinstalls: the choice is kept in a stamp file.
TORCH_STAMP := $(VENV)/.torch-choice
$(TORCH_STAMP): FORCE
	@mkdir -p $(VENV)
	@echo '$(TORCH) $(TORCH_INDEX)' | cmp -s - $@ || echo '$(TORCH) $(TORCH_INDEX)' > $@

$(VENV)/.installed: pyproject.toml constraints.txt $(TORCH_STAMP)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar on $$($(PY) tools/torch_choice.py "$(TORCH)" "$(TORCH_INDEX)")
	@echo "installing flashlib with its lab, test and hf extras"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[lab,test,hf]"
	touch $@

install: $(VENV)/.installed  ## create .venv and install flashlib with the lab, test and hf extras

# Extra flags for jupyter lab, e.g. LAB_ARGS="--ip=0.0.0.0 --no-browser" in a container.
LAB_ARGS ?=
# Jupyter refuses to run as root (containers, cloud notebooks) unless told.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: install  ## start JupyterLab at the course root (notebooks/, exercises/, solutions/), on notebook 00
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir="$(CURDIR)" $(LAB_ARGS) notebooks/00_setup.ipynb

# One pytest-xdist worker per core. --dist loadfile keeps a file on one worker: a notebook's cells run in
# order in one kernel (nbval), and a module-scoped fixture (a whole grading run, say) is made once.
XDIST := -n auto --dist loadfile

test: install  ## every test: pytest for flashlib, nbval over notebooks/ and solutions/ (23-27 min on 2 CPU cores)
	$(PY) -m pytest tests $(PYTEST_NOTEBOOKS) --nbval --nbval-current-env -p no:cacheprovider -rs $(XDIST)

test-lib: install  ## only the library tests, no notebooks (most of make test's time)
	$(PY) -m pytest tests -rs $(XDIST)

# The GPU tests (marked gpu) in the files that hold them; the machine needs no Jupyter packages.
GPU_TEST_FILES = $(shell grep -rl --include="test_*.py" "mark.gpu" tests)
GPU_LOG ?= benchmarks/results/gpu_tests.log
test-gpu: install  ## the GPU tests on a CUDA machine (16 pytest-xdist workers), log and durations in $(GPU_LOG)
	FLASHLIB_TEST_TIMES=$(GPU_LOG).times $(PY) -m pytest -m gpu -n 16 --dist worksteal -rs -q --durations=15 $(GPU_TEST_FILES) 2>&1 | tee $(GPU_LOG)

test-notebooks: install  ## only nbval over the notebooks
	$(PY) -m pytest $(PYTEST_NOTEBOOKS) --nbval --nbval-current-env

test-browser: install  ## notebook 03 in JupyterLab, in headless Chromium (screenshot in test-artifacts/)
	$(PY) -m pytest tests/test_browser.py -v -s -rs -p no:cacheprovider

demo: install  ## headless demo: run the kernels, check them, print results
	$(PY) -m flashlib.demo

advanced: install  ## GQA/MQA, sliding window, layouts, padding, varlen: forward+backward vs the reference
	$(PY) -m flashlib.advanced

grade: install  ## grade learners' notebooks: make grade NB=path/to/notebook_or_folder
	$(PY) -m flashlib.grade $(NB)

exercises: install  ## regenerate exercises/ from solutions/
	$(PY) -m flashlib.course.make_exercises solutions exercises

bench: install  ## matmul benchmark against torch.matmul
	$(PY) -m flashlib.bench --kernel matmul

bench-all: install  ## attention vs SDPA: full grid on a GPU into benchmarks/results/ (CPU: tiny grid, temp file)
	$(PY) -m flashlib.bench $(BENCH_ARGS)

bench-decode: install  ## decoding (KV cache) vs SDPA: the decoding grid on a GPU into benchmarks/results/ (CPU: tiny grid, temp file)
	$(PY) -m flashlib.bench --mode decode $(BENCH_ARGS)

report: install  ## README results section from the newest stored grids (flashlib.report.README_GRIDS); plots: python -m flashlib.report FILES
	$(PY) -m flashlib.report

experiment: install  ## block-size experiment for the tiled matmul (heat map)
	$(PY) -m flashlib.experiment

gpu-info: install  ## what the GPU (or the interpreter) offers
	$(PY) -c "import flashlib; flashlib.print_gpu_info()"

clean:  ## remove caches (keeps .venv)
	rm -rf .pytest_cache .hypothesis build *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
