# so101d: the two commands of the README.
#   make run   - set up .venv and run the daemon on the virtual bench (emulated arms)
#   make test  - set up .venv and run the test suite (TEST_WORKERS=N runs N parallel workers,
#                one file each at a time; 1 by default; it prints the wall time at the end)
#   make test-unit - only the unit tests (marker `unit`: no pty, child process or daemon): about a
#                minute of CPU (2 min on a busy 2-core machine), while you work; `make test` runs them too
# Everything installs into .venv; nothing is installed system-wide.

VENV   := .venv
STAMP  := $(VENV)/.installed
# pyenv's 3.12 is on every workstation and CI machine here; `python3` may be another version.
PYTHON312 := $(shell for p in "$$PYENV_ROOT"/versions/3.12*/bin/python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do [ -x "$$p" ] && { echo "$$p"; break; }; done)

.PHONY: run test test-unit setup bench clean
# The console's end-to-end tests run Debian's chromium + chromedriver (a system package: apt).
BROWSER_STAMP := $(VENV)/.chromium

$(STAMP): pyproject.toml lerobot_plugin/pyproject.toml
	@if [ -z "$(PYTHON312)" ]; then \
	  echo "error: Python 3.12 not found (looked in pyenv's versions and /usr/bin). Install it with 'pyenv install 3.12' and retry." >&2; exit 1; fi
	@echo "using $(PYTHON312)"
	@[ -x $(VENV)/bin/python ] || $(PYTHON312) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	@# the LeRobot plugin (robot and teleoperator so101d): LeRobot's CLIs find it by its name
	$(VENV)/bin/python -m pip install -q --no-deps -e ./lerobot_plugin
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	@# the browser console beside the demo (its own process; it prints its address and waits for the daemon)
	@$(VENV)/bin/so101d --log-level WARNING console & CONSOLE=$$!; trap "kill $$CONSOLE 2>/dev/null" EXIT INT TERM; \
	  $(VENV)/bin/so101d demo

$(BROWSER_STAMP): $(STAMP)
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "error: the console tests need chromium and chromedriver at /usr/bin, and apt-get is not available to install them; install your system's chromium and chromium-driver packages" >&2; exit 1; fi; \
	  echo "installing chromium + chromium-driver (apt-get) for the console's browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y chromium chromium-driver || { $$SUDO apt-get update && $$SUDO apt-get install -y chromium chromium-driver; } || { \
	    echo "error: apt-get could not install chromium chromium-driver (see above)" >&2; exit 1; }; \
	fi
	@touch $(BROWSER_STAMP)

# One worker by default: four on a 2-core machine (a test mostly waits, so two per core looked
# free) took 49.7 min here and put 27 timing-bound tests past their bounds (the loop's rate, a
# policy's latency, a browser's preview rate); on CI's cores the serial run is the one shown to
# pass. `make test TEST_WORKERS=4` on a machine with cores to spare. --dist loadfile: a file's
# tests stay on one worker, so a module fixture (a daemon, a browser) starts once per file.
TEST_WORKERS ?= 1

test: $(STAMP) $(BROWSER_STAMP)
	@start=$$(date +%s); $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests; rc=$$?; \
	  echo "make test: $$(( $$(date +%s) - start )) s wall, $(TEST_WORKERS) workers (exit $$rc)"; exit $$rc

test-unit: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m unit tests

bench: $(STAMP)
	for b in bench/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
