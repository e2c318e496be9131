# Two entry points, each doing its own set-up in a local venv (.venv).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Models and data come from their canonical sources (Hugging Face hub, NLTK) and are downloaded on first use,
# unless the environment says offline (HF_HUB_OFFLINE=1); an optional local mirror is named by ATTNLIP_DATA.

# The venv is exactly requirements.lock: every package pinned with ==, installed with --no-deps so nothing is
# resolved on top of it (torchattacks declares torchvision, which cannot import beside torch 2.13.0, and rxnfp old
# scipy/scikit-learn pins; neither is imported). pyproject.toml keeps the ranges for library users. The check at
# the end fails when the venv holds anything the lock does not (an older venv: remove .venv and install again).
LOCK := requirements.lock
$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-deps $$(grep -E '^pip==' $(LOCK))
	$(VPY) -m pip install -q --no-deps -r $(LOCK)
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e .
	$(VPY) -m harness.lockfile --check
	touch $@

# Regenerate requirements.lock from the venv (pip freeze, checked against pyproject.toml's ranges).
.PHONY: lock
lock:
	$(VPY) -m harness.lockfile --write

# Fashion-MNIST from Debian's dataset-fashion-mnist, downloaded and unpacked into .data/ without root (apt-get
# download, else the Debian pool URL; dpkg-deb -x). The hub copy (zalando-datasets/fashion_mnist) is the fallback.
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
# Everything the default run reads (attnlip data fetch: NLTK's downloader and the Hugging Face hub, into their own
# caches, with a progress bar), after Debian's Fashion-MNIST. Offline it prints what is missing and why, and still
# succeeds, so an offline install completes; `$(VPY) -m harness.entry data fetch` exits 1 when anything is missing.
data: $(VENV)/.installed
	@$(MAKE) --no-print-directory $(FMNIST_DIR)/train-images-idx3-ubyte.gz 2>/dev/null || \
	  { rm -rf .data/deb; echo "note: Debian's dataset-fashion-mnist could not be fetched; Fashion-MNIST comes from the hub instead" >&2; }
	@$(VPY) -m harness.entry data fetch || \
	  echo "WARNING: some datasets are missing (listed above); experiments that read them stop with MISSING DATA until \`make data\` runs with network or ATTNLIP_DATA names a mirror" >&2

install: $(VENV)/.installed
	@$(MAKE) --no-print-directory data || echo "WARNING: could not fetch Fashion-MNIST (make data); the ViT experiments will fail with MISSING DATA until it is there" >&2

# Every core by default: -j $(JOBS) runs the cells in a process pool of that many workers; a -j, --jobs or
# --executor in ARGS comes later on the command line and wins (e.g. make quick ARGS='-j 1'), as does JOBS=N.
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
run: install
	$(VPY) run_all.py -j $(JOBS) $(ARGS)

quick: install
	$(VPY) run_all.py --quick -j $(JOBS) $(ARGS)

# pytest exit code 5 (no tests collected) is a failure here, reported by name.
test: install
	$(VPY) -m pytest -q -p no:cacheprovider --benchmark-disable $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5)"; fi; exit $$rc

bench: install
	$(VPY) -m pytest benchmarks -q --benchmark-only --benchmark-columns=median,iqr,rounds --benchmark-sort=name $(ARGS)
