# Two entry points, each doing its own set-up in a local venv (.venv).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
SHARED ?= $(abspath ../shared)
export HF_HUB_OFFLINE=1
export HF_DATASETS_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export NLTK_DATA ?= $(SHARED)/data/nltk_data
export ATTNLIP_DATA ?= $(SHARED)/data

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[dev]'
	# torchattacks declares torchvision (which cannot import beside torch 2.13.0) but never imports it: no deps.
	$(VPY) -m pip install -q --no-deps torchattacks==3.5.1
	# A second real trained model for attnlip analyze (rxnfp 0.1.0: BERT, MIT, 75 MB wheel); its deps are not needed.
	$(VPY) -m pip install -q --no-deps rxnfp==0.1.0 || echo "WARNING: rxnfp not installed; its analyze test will skip" >&2
	touch $@

# Datasets the default run needs that are not in ../shared: Fashion-MNIST from Debian's dataset-fashion-mnist,
# downloaded and unpacked into .data/ without root (apt-get download, else the Debian pool URL; dpkg-deb -x).
FMNIST_DEB := dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb
FMNIST_DIR := .data/fashion-mnist/usr/share/datasets/fashion-mnist
$(FMNIST_DIR)/train-images-idx3-ubyte.gz:
	mkdir -p .data/deb
	cd .data/deb && (apt-get download dataset-fashion-mnist 2>/dev/null || \
	  curl -fsSLO "http://deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/$(FMNIST_DEB)")
	dpkg-deb -x .data/deb/dataset-fashion-mnist_*_all.deb .data/fashion-mnist
	rm -rf .data/deb
	test -f $@

.PHONY: install run quick test bench data
data: $(FMNIST_DIR)/train-images-idx3-ubyte.gz

install: $(VENV)/.installed
	@$(MAKE) --no-print-directory data || echo "WARNING: could not fetch Fashion-MNIST (make data); the ViT experiments will fail with MISSING DATA until it is there" >&2

run: install
	$(VPY) run_all.py $(ARGS)

quick: install
	$(VPY) run_all.py --quick $(ARGS)

# pytest exit code 5 (no tests collected) is a failure here, reported by name.
test: install
	$(VPY) -m pytest -q -p no:cacheprovider --benchmark-disable $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5)"; fi; exit $$rc

bench: install
	$(VPY) -m pytest benchmarks -q --benchmark-only --benchmark-columns=median,iqr,rounds --benchmark-sort=name $(ARGS)
