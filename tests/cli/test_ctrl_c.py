"""Ctrl-C at any moment of start-up exits 130 with one line, "exactspec COMMAND: interrupted".

Each case starts `exactspec generate` as the program (`main()` reading its own argv, as the `exactspec`
script and `python -m exactspec` do) in a child process whose start-up is held at one point: it writes a
marker there and waits; the test sends SIGINT as soon as it reads the marker. The points: model loading
in Python code, model loading inside a C library's callback into Python (llama.cpp calls its Python log
callback while a model loads; here libc's qsort calls a comparison written in Python), and the
interpreter's shutdown after the command returned. tests/cli/test_bad_inputs.py covers the imports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exactspec.cli import EXIT_INTERRUPTED

REPO = Path(__file__).resolve().parents[2]
MARKER = "HELD-HERE"

HARNESS = textwrap.dedent(
    """
    import atexit, ctypes, sys, time
    import exactspec.cli.generate as generate
    from exactspec.cli.main import main

    def held():
        print("{marker}", file=sys.stderr, flush=True)

    def load_in_python(args):
        held()
        time.sleep(30)
        raise SystemExit("not interrupted")

    def load_in_a_c_callback(args):
        compare_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        calls = []

        def compare(a, b):  # Python called from C: a Ctrl-C raised here is swallowed by ctypes
            calls.append(1)
            if len(calls) == 1:  # once, even when the interrupt lands inside held()
                held()
            time.sleep(0.1)
            return 0

        callback = compare_type(compare)
        data = (ctypes.c_int * 12)()
        ctypes.CDLL(None).qsort(data, len(data), ctypes.sizeof(ctypes.c_int), callback)
        time.sleep(10)  # back in Python: the interruption must arrive here
        raise SystemExit("not interrupted: the Ctrl-C was lost in the C call")

    def return_then_shut_down_slowly(args):
        atexit.register(lambda: (held(), time.sleep(30)))
        return 0

    point = sys.argv.pop(1)
    generate.run = {{
        "python": load_in_python, "callback": load_in_a_c_callback, "shutdown": return_then_shut_down_slowly
    }}[point]
    sys.argv = ["exactspec", "generate", "--no-progress", "def f(x):"]
    sys.exit(main())
    """
).format(marker=MARKER)


def _interrupt_at(point: str) -> tuple[int, list[str]]:
    """Start the held command, send SIGINT at the marker; (exit status, stderr lines after the marker)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HARNESS, point],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    before = []
    for line in process.stderr:
        if line.strip() == MARKER:
            process.send_signal(signal.SIGINT)
            break
        before.append(line)
    try:
        _, after = process.communicate(timeout=60)
    finally:
        process.kill()
    assert not before, before
    return process.returncode, after.splitlines()


@pytest.mark.parametrize("point", ["python", "callback"])
def test_ctrl_c_while_the_models_load_exits_130_with_one_line(sigint_not_ignored: None, point: str) -> None:
    """Before, inside a C callback: the interrupt was swallowed and the run went on."""
    code, lines = _interrupt_at(point)
    assert (code, lines) == (EXIT_INTERRUPTED, ["exactspec generate: interrupted"])


def test_ctrl_c_while_the_interpreter_shuts_down_ends_it_quietly(sigint_not_ignored: None) -> None:
    """After the command returned, Ctrl-C has its default action: the process ends by the signal (what a
    shell reports as 130), with nothing printed. Before: "Exception ignored in atexit callback" and a
    traceback."""
    code, lines = _interrupt_at("shutdown")
    assert (code, lines) == (-signal.SIGINT, [])
