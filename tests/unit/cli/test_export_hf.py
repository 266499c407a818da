"""`evaluate export-hf CKPT OUT` on the tiny checkpoint: written and checked, then found and not checked again;
an output directory that is not an export is refused in one message, before anything is written."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ckpteval.cli.main import app


def test_export_then_find_it_again(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    first = CliRunner().invoke(app, ["export-hf", str(tiny_checkpoint), str(out)], terminal_width=80)
    assert first.exit_code == 0, first.output
    assert f"{out}: written" in first.output and "LlamaForCausalLM" in first.output
    assert "parity: passed" in first.output and "greedy tokens identical on 3 prompts" in first.output
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert (out / "generation_config.json").is_file() and (out / "ckpteval_parity.json").is_file()

    again = CliRunner().invoke(app, ["export-hf", str(tiny_checkpoint), str(out)], terminal_width=80)
    assert again.exit_code == 0, again.output
    assert "found (the same checkpoint content)" in again.output and "kept from its first check" in again.output
    assert all(len(line) <= 80 for line in again.output.splitlines() if not line.startswith("/"))


def test_an_output_that_is_not_an_export_is_refused(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(app, ["export-hf", str(tiny_checkpoint), str(out)])
    assert result.exit_code == 1
    assert "is not an export of ckpteval's; not replacing it" in result.output
    assert "Traceback" not in result.output and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
