# The two commands of the README. Both do all set-up idempotently (see scripts/setup.sh).
.PHONY: run test setup-run setup-test lint bench image release clean

PY := .venv/bin/python
ARGS ?=

run: setup-run
	.venv/bin/perfbalance run $(ARGS)

test: setup-test
	.venv/bin/ruff check -q .
	.venv/bin/lint-imports
	$(PY) -m pytest -p no:cacheprovider $(ARGS)

setup-run:
	scripts/setup.sh run

setup-test:
	scripts/setup.sh test

bench: setup-test
	.venv/bin/perfbalance bench collect --json
	.venv/bin/perfbalance bench plan --json

# The agent's image from deploy/Containerfile with podman; no registry needed (docs/deploy.md)
image: setup-test
	scripts/build-image.sh

# sdist, wheel, image (OCI archive), checksums in dist/; the wheel checked in a clean venv
release: setup-test
	scripts/release.sh

clean:
	rm -rf .venv build dist *.egg-info
