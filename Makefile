# The two quickstart commands: `make up` (the main job on the embedded default)
# and `make test` (install what the tests need, then run the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: up test install clean

# the modules Cython compiles at install time (src/wakeline/_compiled.py) and the
# declarations beside some of them (.pxd): an edited one is rebuilt by the next `make test`
COMPILED := $(shell $(PYTHON) -c "import runpy; print(' '.join('src/' + m.replace('.', '/') \
	+ '.py' for m in runpy.run_path('src/wakeline/_compiled.py')['MODULES']))")

$(BIN)/.wakeline-installed: pyproject.toml setup.py src/wakeline/core/_ccodec.c \
		src/wakeline/_compiled.py $(COMPILED) $(wildcard src/wakeline/core/*.pxd)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

install: $(BIN)/.wakeline-installed

up: install
	$(BIN)/wakeline up $(UP_ARGS)

test: install
	$(BIN)/wakeline services fetch
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	-$(BIN)/wakeline services down
	rm -rf .wakeline
