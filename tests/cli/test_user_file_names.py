"""Names in user files and options that the file system cannot hold or autopar does not know: a
device file's ``base``, a 300-character ``--model``, a script's 300-character tokenizer path.
Each was found by the fuzz suite (tests/fuzz/test_fuzz_*.py)."""

from __future__ import annotations

import pytest

from test_bad_input import one_line_error


def test_device_file_with_an_unknown_base_names_the_base_key(tmp_path):
    """Was "--device='': unknown device", for a --device the user never gave."""
    path = tmp_path / "dev.yaml"
    path.write_text('base: ""\n')
    assert "--device-file base='': unknown device; known: a100-40gb" in one_line_error(
        ["estimate", "-m", "llama3-8b", "--device-file", str(path)])


def test_model_name_too_long_for_the_file_system():
    """Path.exists() / Path.is_dir() raised OSError: File name too long (a traceback)."""
    err = one_line_error(["estimate", "-m", "x" * 300 + ".json", "--device", "h100-80gb"])
    assert err.startswith("error: --model='xxx") and "': cannot read (File name too long)" in err
    err = one_line_error(["estimate", "-m", "x" * 300, "--device", "h100-80gb"])
    assert err.startswith("error: --model='xxx") and "not a file and not a preset" in err


@pytest.mark.parametrize("flag", ["--tokenizer-model", "--vocab-file", "--tokenizer-name-or-path"])
def test_script_tokenizer_path_too_long_for_the_file_system(tmp_path, flag):
    """A script's tokenizer path of 300 characters: Path.is_dir() raised OSError (a traceback);
    it is now a file autopar cannot open, so the vocabulary size is asked for."""
    from test_bad_input import BASE_SCRIPT

    path = tmp_path / "job.sh"
    path.write_text(BASE_SCRIPT.replace("--tokenizer-type Llama2Tokenizer", f"--tokenizer-type Llama2Tokenizer "
                                        f"{flag} {'a' * 300}", 1))
    err = one_line_error(["estimate", "--script", str(path), "--device", "h100-80gb"])
    assert "the vocabulary size is unknown" in err


@pytest.mark.parametrize("args, option", [
    (["validate", "--out", "{dir}/report", "--csv"], "--csv"),  # was "--out=...: cannot write the report"
    (["search", "-m", "llama3-8b", "--device", "h100-80gb", "--top", "1", "--profile-db"], "--profile-db"),  # OSError
])
def test_input_name_too_long_for_the_file_system(tmp_path, args, option):
    name = str(tmp_path / ("x" * 300 + ".csv"))
    err = one_line_error([a.format(dir=tmp_path) for a in args] + [name])
    assert err.startswith(f"error: {option}='") and err.endswith("': cannot read (File name too long)"), err
