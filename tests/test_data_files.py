"""The data files the tests and ``autopar validate`` use live in the repository.

A clean clone must test itself, so the model configs, launch scripts and measurements are copies
kept in the repository. Where the steering checkout's ``../shared/`` sits beside this one (a
developer's machine), these tests check the copies are still the same files; elsewhere (a clean
clone, CI without it) they check only that the copies are present.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from conftest import MEASUREMENTS, MODELS, SCRIPTS

from autopar.validate import DEFAULT_CSV

SHARED = Path(__file__).resolve().parents[2] / "shared"

#: (copy in the repository, the file it mirrors under ../shared/)
PAIRS = ([(MODELS / p.name, Path("models") / p.name) for p in sorted(MODELS.glob("*.json"))]
         + [(SCRIPTS / p.name, Path("scripts") / p.name) for p in sorted(SCRIPTS.glob("*.sh"))]
         + [(MEASUREMENTS, Path("validation/measurements.csv")),
            (MEASUREMENTS.with_name("README.md"), Path("validation/README.md"))])


def test_validate_default_csv_is_the_shipped_copy():
    assert DEFAULT_CSV.resolve() == MEASUREMENTS.resolve() and DEFAULT_CSV.is_file()


def test_repository_holds_every_data_file_it_tests_with():
    assert len(list(MODELS.glob("*.json"))) >= 15 and len(list(SCRIPTS.glob("*.sh"))) >= 2
    assert all(copy.is_file() for copy, _ in PAIRS)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared beside this checkout (a clean clone): nothing to compare")
@pytest.mark.parametrize("copy, source", PAIRS, ids=[str(s) for _, s in PAIRS])
def test_copy_matches_shared(copy, source):
    origin = SHARED / source
    if not origin.exists():
        pytest.skip(f"../shared/{source} is gone: remove or keep the repository's copy on purpose")
    assert filecmp.cmp(copy, origin, shallow=False), f"{copy} differs from ../shared/{source}: copy it again"


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared beside this checkout (a clean clone): nothing to compare")
def test_every_shared_model_and_script_is_copied():
    missing = [p.name for p in (SHARED / "models").glob("*.json") if not (MODELS / p.name).is_file()]
    missing += [p.name for p in (SHARED / "scripts").glob("*.sh") if not (SCRIPTS / p.name).is_file()]
    assert not missing, f"copy these from ../shared into the repository: {missing}"
