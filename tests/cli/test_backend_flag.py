"""Commands that measure through transformers modules refuse --backend llamacpp in one line, first."""

from __future__ import annotations

import pytest

from exactspec.cli.common import EXIT_USAGE
from exactspec.cli.main import main


@pytest.mark.parametrize("command", ["bench", "audit", "numerics"])
def test_measuring_commands_refuse_llamacpp(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--backend", "llamacpp", "--target", "/nonexistent"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "--backend llamacpp" in err and len(err.splitlines()) == 1
    assert "/nonexistent" not in err  # refused before any model was looked for
