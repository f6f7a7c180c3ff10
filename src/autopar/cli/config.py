"""``--config FILE``: any command's options from a YAML or JSON file, one section per command.

The file maps a command name to its options (as Tinker's ``parameter_config.json`` holds one
section per tool), nested for sub-commands::

    search: {model: llama3-70b, device: h100-80gb, nodes: 8, tp: "2,4", no_cp: true}
    profile: {run: {...}}

Keys are option names with or without dashes (``seq-len``, ``seq_len``, ``--seq-len``). The file
becomes click's ``Context.default_map`` (typer runs on click), so the command line overrides it and
each value goes through the option's own type check. A list is joined with commas for a
single-valued option (``pp: [1, 2, 4]`` is ``--pp 1,2,4``). Unknown sections and keys are refused
before any command runs, with one line naming the key and the section.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

CONFIG_FILES = "autopar.config_files"
"""Key of ``Context.meta`` (shared by a command's context and its parents') under which
:func:`load_config` lists the ``--config`` files read, for :func:`given_config_files`."""


def given_config_files() -> list[str]:
    """The ``--config`` files of the command now running (the group's and the command's own, in
    that order); empty outside a command or without ``--config``.

    Read from the click context of the running command, so every output check
    (:func:`autopar.cli.paths.refuse_overwriting_inputs`) protects the file without each command
    passing it on.
    """
    ctx = _current_context()
    return list(ctx.meta.get(CONFIG_FILES, [])) if ctx is not None else []


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: a JSON object, refusing a key given twice (JSON
    keeps the last: two ``"search"`` sections were one).

    Raises:
        ValueError: ``duplicate key 'search' (JSON keeps only the last; give each key once)``.
    """
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} (JSON keeps only the last; give each key once)")
        out[key] = value
    return out


def option_given(name: str) -> bool:
    """Whether the running command's parameter ``name`` (``top``) was given, on the command line
    or in a ``--config`` file, rather than left at its default (click's ``ParameterSource``);
    False outside a command."""
    ctx = _current_context()
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT",)


def given_command_line() -> str | None:
    """The running command as a command line that reproduces it: ``autopar`` and the command path,
    then every option given (on the command line or in a ``--config`` file, :func:`option_given`)
    with its value, ``--config`` itself left out (its values are spelled out), shell-quoted; a
    flag's ``--no-...`` form where it is off; a repeatable option (``--device-set``) once per
    value, as it was given (not the Python list ``['memory_bytes=100e9', ...]``). None outside a
    command."""
    import shlex

    ctx = _current_context()
    if ctx is None:
        return None
    words = ["autopar", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        name = param.name
        if name == "config" or not option_given(name) or not getattr(param, "opts", None):
            continue
        value = ctx.params.get(name)
        if getattr(param, "is_flag", False):
            flag = param.opts[0] if value else (param.secondary_opts or [None])[0]
            words += [flag] if flag else []
        elif getattr(param, "multiple", False) and isinstance(value, (list, tuple)):
            for item in value:  # a repeatable option once per item: --device-set K=V --device-set K2=V2
                words += [param.opts[0], str(item)]
        elif value is not None:
            words += [param.opts[0], str(value)]
    return shlex.join(words)


def _current_context() -> Any:
    """click's context of the running command, or None."""
    try:  # typer >= 0.20 carries its own copy of click
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - older typer on click itself
        from click import get_current_context

    return get_current_context(silent=True)


def _key(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def _options(command: Any) -> dict[str, Any]:
    """Accepted key -> the click parameter of ``command`` (its name and its long options)."""
    out = {}
    for param in command.params:
        if param.name == "config":
            continue
        for name in [param.name, *getattr(param, "opts", [])]:
            if name.startswith("-") and not name.startswith("--"):
                continue  # short options (-m) are not keys
            out[_key(name)] = param
    return out


def _shown(value: Any) -> str:
    """``value`` as the file wrote it, for an error line: JSON for a scalar (``"1:30"``, ``true``),
    a list's items unquoted where they are the text of a number (``[1, true]``)."""
    if isinstance(value, list):
        return "[" + ", ".join(v if isinstance(v, str) else json.dumps(v) for v in value) + "]"
    return json.dumps(value)


def _refuse_true_false(param: Any, key: str, value: Any, path: str, section: str) -> None:
    """Refuse a YAML/JSON true/false for an option that takes a value (``gbs: true``): click
    would read it as 1 or 0 (Python's ``int(True)``), searching gbs 1 without a word. Flags
    (``no_cp: true``) take true/false; the same check covers each item of a list (``pp: [1, true]``).

    Raises:
        typer.BadParameter: ``FILE: key 'gbs' in section 'search' is true: --gbs takes a value, not true/false``.
    """
    if getattr(param, "is_flag", False) or getattr(getattr(param, "type", None), "name", "") == "boolean":
        return
    if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
        option = next((o for o in param.opts if o.startswith("--")), param.name)
        raise typer.BadParameter(f"{path}: key {key!r} in section {section!r} is {_shown(value)}: {option} takes "
                                 "a value, not true/false")


def _refuse_wrong_kind(param: Any, key: str, value: Any, path: str, section: str) -> None:
    """Refuse, before click reads it with the library's own wording ("Input should be a valid
    boolean, unable to interpret input"), a value of the wrong kind for its option: a flag not
    true/false (``flash_attention: nope``), a list for an option that takes one value and is no
    comma-separated set (``gbs: [64, 128]``), a number option's text that is no number
    (``memory_margin: "10%"``). The line names the file, the key, the value and what is allowed.

    Raises:
        typer.BadParameter: ``FILE: key 'gbs' in section 'search' is [64, 128]: --gbs takes one
            whole number, not a list``.
    """
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    option = next((o for o in param.opts if o.startswith("--")), param.name)
    where = f"{path}: key {key!r} in section {section!r} is {_shown(value)}"
    if getattr(param, "is_flag", False) or annotation is bool:
        if value is not None and not isinstance(value, bool):  # null: as if not given
            pair = "/".join([option, *getattr(param, "secondary_opts", [])])
            raise typer.BadParameter(f"{where}: {pair} is a flag: give true or false")
        return
    kind = "whole number" if annotation is int else "number" if annotation is float else None
    if isinstance(value, list) and not param.multiple and annotation is not str:
        raise typer.BadParameter(f"{where}: {option} takes one {kind or 'value'}, not a list")
    if annotation is float:
        for item in value if isinstance(value, list) else [value]:
            try:
                float(item)
            except (TypeError, ValueError):
                example = f", e.g. {param.default:g}" if isinstance(param.default, float) else ""
                raise typer.BadParameter(f"{where}: {option} takes a number (digits, '.', an exponent such as "
                                         f"1e-2){example}") from None


def _refuse_loose_integer(param: Any, key: str, value: Any, path: str, section: str) -> None:
    """For an ``int`` option, a number that is not whole (``tp: 2.0``) or a text that is not
    :data:`autopar.integers.INTEGER_RULE` (``tp: "1_0"``), as on the command line.

    Raises:
        typer.BadParameter: ``FILE: key 'tp' in section 'search' is 2.0: expected a whole number ...``.
    """
    from autopar.cli.commands import takes_int
    from autopar.integers import INTEGER_RULE, is_integer_text

    if not takes_int(param):
        return
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, float) or (isinstance(item, str) and not is_integer_text(item)):
            raise typer.BadParameter(f"{path}: key {key!r} in section {section!r} is {json.dumps(item)}: expected "
                                     f"{INTEGER_RULE}")


def default_map(group: Any, data: Any, path: str, section: str = "") -> dict[str, Any]:
    """``data`` (the parsed file) as a click ``default_map`` for ``group``'s commands.

    Raises:
        typer.BadParameter: a section that is no command, a key that is no option of its
            section's command, two spellings of one option (``seq-len`` and ``seq_len``: YAML
            and JSON see two keys, click would keep one), or a section that is not a mapping
            (one line naming both).
    """
    where = f"section {section!r}" if section else "the top level"
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path}: {where} must map names to values ('name: value' lines), "
                                 f"got {'a list' if isinstance(data, list) else _shown(data)}")
    commands = getattr(group, "commands", None)
    out: dict[str, Any] = {}
    first_key: dict[str, Any] = {}  # option name -> the key that gave it
    for key, value in data.items():
        name = f"{section} {key}".strip()
        if commands is not None:  # a group: keys are command names
            if key not in commands:
                raise typer.BadParameter(f"{path}: unknown section {name!r}; allowed {', '.join(sorted(commands))}")
            out[key] = default_map(commands[key], value, path, name)
            continue
        accepted = _options(group)
        if _key(str(key)) not in accepted:
            names = {next((o[2:] for o in p.opts if o.startswith("--")), p.name) for p in accepted.values()}
            raise typer.BadParameter(f"{path}: unknown key {key!r} in section {section!r}; allowed "
                                     f"{', '.join(sorted(names))}")
        param = accepted[_key(str(key))]
        if param.name in first_key:  # seq-len and seq_len (or --seq-len): one option given twice
            option = next((o for o in param.opts if o.startswith("--")), param.name)
            raise typer.BadParameter(f"{path}: keys {first_key[param.name]!r} and {key!r} in section {section!r} are "
                                     f"both {option}: give it once")
        first_key[param.name] = key
        _refuse_true_false(param, key, value, path, section)
        _refuse_wrong_kind(param, key, value, path, section)
        _refuse_loose_integer(param, key, value, path, section)
        if isinstance(value, list) and not param.multiple:
            value = ",".join(map(str, value))
        elif param.multiple and not isinstance(value, list):  # one value of a repeatable option (device_set: K=V)
            value = [value]
        out[param.name] = value
    return out


def _yaml_load(text: str) -> Any:
    """YAML ``text`` with numbers left as the text written: ``gbs: 010`` is ``"010"``, which the
    option's own reader then reads as the command line does (``--gbs 010`` is 10).

    YAML 1.1's implicit number rules (PyYAML's ``SafeLoader``) read more than autopar's integer
    reader (:data:`autopar.integers.INTEGER_RULE`): ``010`` as octal 8, ``1:30`` as base-60 90,
    ``16:32`` (a ``gbs_range``) as 992, ``0x10`` as 16, ``4_096`` as 4096. Here the ``int`` and
    ``float`` implicit resolvers are dropped, so every plain scalar but true/false and null is a
    ``str`` and goes through the same parser as the command line. Keys given twice in one mapping
    stay refused (:func:`autopar.specs.long_numbers.yaml_load`'s loader).

    Raises:
        yaml.YAMLError: as ``yaml.load``.
    """
    import yaml

    from autopar.specs.long_numbers import _loader

    base = _loader()
    loader = type("_ConfigLoader", (base,), {})
    loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for first, resolvers in base.yaml_implicit_resolvers.items()}
    return yaml.load(text, Loader=loader)  # noqa: S506 (a SafeLoader subclass)


def load_config(ctx: typer.Context, param: Any, path: str | None) -> str | None:
    """Eager ``--config`` callback: read ``path`` (JSON or YAML), check it against every command
    and set ``ctx.default_map`` (the whole file on the top-level group, the command's own section
    on a command).

    Raises:
        typer.BadParameter: an unreadable or unparsable file, or a key refused by :func:`default_map`.
    """
    if path is None or ctx.resilient_parsing:
        return path
    import yaml  # only where a --config file is given

    try:
        text = Path(path).read_text()
    except OSError as err:
        raise typer.BadParameter(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise typer.BadParameter(f"{path}: not a text file (expected YAML or JSON)") from None
    try:
        data = json.loads(text, object_pairs_hook=_once) if path.endswith(".json") else _yaml_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise typer.BadParameter(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'} "
                                 f"({str(err).splitlines()[0]})") from None
    root = ctx.find_root()
    # only an empty file is no options: a top level of [], '' or 0 is refused as a list is
    full = default_map(root.command, {} if data is None else data, path)
    ctx.meta.setdefault(CONFIG_FILES, []).append(path)  # an input no output may overwrite (cli/paths.py)
    if ctx.parent is None:
        ctx.default_map = full
    else:
        names = []
        c = ctx
        while c.parent is not None:
            names.insert(0, c.info_name)
            c = c.parent
        for name in names:
            full = full.get(name, {})
        ctx.default_map = full
    return path


Config = Annotated[Optional[str], typer.Option(
    "--config", is_eager=True, callback=load_config, expose_value=False,
    help="YAML or JSON file of options, one section per command (e.g. 'search: {tp: 4, gbs: 512}'); "
    "the command line wins")]
