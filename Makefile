# The two quick-start commands (README): `make run` and `make test`.
.PHONY: setup setup-llamacpp run serve test lint slow

# What the default path uses (ONNX Runtime, the server, Ray, the tests' tools), without llama.cpp.
setup:
	bash scripts/setup.sh

# The same and llama-cpp-python, compiled for this CPU once per machine (minutes on 2 cores; the wheel is
# cached): what the tests need (`--backend llamacpp`, the bench's llama.cpp peer).
setup-llamacpp:
	bash scripts/setup.sh --llamacpp

# The main job: speculative generation on the built-in default pair (the first run fetches the models and
# exports the target to ONNX for --backend auto to measure), on an edit of a given function, where the
# answer repeats the prompt's code and drafts are accepted; then the same prompt decoded plainly, for the
# summary's last line: tokens a round, the speed against plain decoding, whether the tokens are identical.
run: setup
	.venv/bin/exactspec generate --chat --max-new-tokens 200 --compare-plain \
	  --prompt-file scripts/first-run-prompt.txt

# The OpenAI-compatible server on the built-in default pair, http://127.0.0.1:8000/v1 (README, Serving).
serve: setup
	.venv/bin/exactspec serve

test: setup-llamacpp
	.venv/bin/ruff check exactspec tests scripts
	.venv/bin/ruff format --check exactspec tests scripts
	.venv/bin/python -m pytest -q -n 2 --dist worksteal

# Opt-in real-model tests on the default pair (slow: fetches and converts the models on first use).
slow: setup-llamacpp
	.venv/bin/python -m pytest -q -m slow
