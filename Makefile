# dsa-triton: make install | make test | make demo
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CKPT ?= checkpoints/tiny-glm

.PHONY: install test checkpoint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

install: $(PY)
	# torch first and pinned: the CPU build of 2.13.0 is on local disk, anything else pulls GBs
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'

# Two workers, each taking whole modules (a module's server fixture stays in one worker), at one
# OpenMP thread each: with torch's default of a thread a core, the two workers' threads spun
# against each other on a 2-core machine and the suite crawled. 13 minutes against 19 serially.
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

checkpoint: install
	$(PY) -m dsa_backend.tools.make_checkpoint --arch glm_moe_dsa --preset tiny --out $(CKPT)

clean:
	rm -rf $(VENV) checkpoints *.egg-info

# --- serving (docs/SERVING.md) ---
MODEL ?= $(CKPT)
.PHONY: install-server serve demo

# $TRITONSERVER (and $TRITON_BACKEND_DIR) when set; else the NGC image's /opt/tritonserver when
# present; else the server bundled in the nvidia-pytriton wheel, --no-deps because its own
# dependencies pin numpy < 2 (the stub gets its own numpy). Without internet, STUB_WHEELS=DIR
# (or $DSA_STUB_WHEELS) names a directory holding a numpy<2 wheel for the stub environment.
STUB_WHEELS ?=
install-server: install
	test -n "$$TRITONSERVER" || test -x /opt/tritonserver/bin/tritonserver || \
		$(PY) -m pip install -q --no-deps nvidia-pytriton==0.7.0
	$(PY) -m dsa_backend.serving.install $(if $(STUB_WHEELS),--wheel-dir $(STUB_WHEELS))

# the serving tests start real servers
test: install-server

serve: install-server
	$(PY) -m dsa_backend.serving.serve --model $(MODEL)

demo: install-server checkpoint
	$(PY) -m dsa_backend.serving.demo --model $(CKPT)
