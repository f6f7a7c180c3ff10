"""The file and text options a command is given: empty values, and outputs that would overwrite
an input.

Every command checks its options with these two helpers before it reads or writes anything, so
a mistake costs one ``error:`` line (:class:`~autopar.errors.AutoparError`, exit code 2) and never
a lost launch script, config or result file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping


def refuse_empty(options: Mapping[str, object]) -> None:
    """Refuse an option given as an empty (or blank) string.

    ``--out ''`` or ``--script ''`` usually comes from an unset shell variable (``--out $OUT``);
    taking it as "not given" would print to stdout, ignore the script or export the default
    layout without a word.

    Args:
        options: option name as the user writes it (``--out``) -> the value given (None when not
            given; values that are not strings are not checked).
    Raises:
        AutoparError: ``--X='': empty; ...`` for the first such option.
    """
    from autopar.errors import AutoparError

    for name, value in options.items():
        if isinstance(value, str) and not value.strip():
            raise AutoparError(f"{name}={value!r}: empty; give a value or leave {name} out (an unset shell "
                               "variable?)")


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once symlinks are followed, or (both
    existing) the same inode, which also catches hard links."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def refuse_overwriting_inputs(inputs: Mapping[str, str | Path | None],
                              outputs: Mapping[str, tuple[str | Path | None, Iterable[Path]]]) -> None:
    """Refuse a command whose outputs include one of its own inputs, or one file twice.

    Paths are compared after following symlinks (``os.path.realpath``; an output that is a link
    to an input counts as that input) and by inode where both exist (hard links). An input that
    does not exist as a file (a preset name such as ``--model llama3-8b``) cannot be overwritten
    and is skipped. The ``--config`` files of the running command
    (:func:`autopar.cli.config.given_config_files`) are inputs too, without being passed.

    Args:
        inputs: input option (``--script``) -> the path given (None: not given).
        outputs: output option (``--report``) -> (the value given, None when not given; the
            files the command writes for it: ``--report DIR`` writes ``DIR/result.json``, ...).
    Raises:
        AutoparError: ``--out='run.sh': would overwrite the --script input; ...`` (for a directory
            output, the file inside it is named; for a link, the input it points to), or two
            outputs writing one file.
    """
    from autopar.cli.config import given_config_files
    from autopar.errors import AutoparError

    named = [*(("--config", path) for path in given_config_files()), *inputs.items()]
    given = [(name, Path(path)) for name, path in named if path is not None and os.path.isfile(path)]
    seen: dict[str, tuple[str, Path]] = {}
    for option, (value, files) in outputs.items():
        if value is None:
            continue
        for file in files:
            for name, path in given:
                if _same_file(file, path):
                    what = f"the {name} input" + ("" if str(path) == str(file) else f" {str(path)!r}")
                    where = "would overwrite" if str(file) == str(value) else f"would write {str(file)!r} over"
                    raise AutoparError(f"{option}={str(value)!r}: {where} {what}; write the output somewhere else")
            key = os.path.realpath(file)
            if key in seen and seen[key][0] != option:
                other, other_file = seen[key]
                raise AutoparError(f"{option}={str(value)!r}: writes {str(file)!r}, which {other} writes too "
                                   f"({str(other_file)!r}); give them different paths")
            seen[key] = (option, file)


FIGURE_SUFFIXES = (".png", ".svg", ".pdf")  # figure formats a --plot file may have (matplotlib's savefig)


def refuse_unwritable_figure(option: str, path: str | None, suffixes: tuple[str, ...] = FIGURE_SUFFIXES) -> None:
    """Refuse a figure output before any work: its directory must exist and its name end in
    one of ``suffixes`` (a directory given as the file made matplotlib append .png).

    Args:
        option: the option as the user writes it (``--plot``).
        path: the value given, None when not given (nothing to check).
        suffixes: the file name endings the figure can be written as (default :data:`FIGURE_SUFFIXES`).
    Raises:
        AutoparError: ``--plot='x': cannot write (no directory ...)`` or ``give a file name ending in ...``.
    """
    from autopar.errors import AutoparError

    if path is None:
        return
    if not Path(path).resolve().parent.is_dir():
        raise AutoparError(f"{option}={path!r}: cannot write (no directory {str(Path(path).resolve().parent)!r})")
    if Path(path).suffix.lower() not in suffixes:
        raise AutoparError(f"{option}={path!r}: give a file name ending in {', '.join(suffixes)}")
