# Two entry points: `make demo` (the main job on the embedded default) and `make test`.
# Both create/update .venv from the pinned requirements; a changed pin reinstalls.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA ?= ./data

.PHONY: demo test test-fast lint install browser clean

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt -c constraints.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hotstep-ray demo --data $(DATA)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The studio page test drives a real headless Chromium (Debian's package). Installed when missing
# and apt-get can run as root (CI, our dev boxes); elsewhere the test skips unless CI is set.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the studio page test will skip (or fail under CI=true)"; }

test: lint browser
	$(BIN)/python -m pytest

# A developer's quick tier: everything not marked slow. CI and the README run `make test`.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache .ruff_cache
