"""Write autopar's launch-script flag table and its Markdown page from fetched framework copies.

    python tools/script_flags.py [--megatron GIT_DIR] [--mindspeed-llm GIT_DIR] [--mindspeed GIT_DIR]

Reads the flag names of Megatron-LM's and MindSpeed-LLM's (with MindSpeed's) argument parsers
(:mod:`script_flags_extract`; git directories as the ``fetch`` tool writes them) and classifies
each: ``modelled`` when autopar's script reader reads it
(:func:`autopar.specs.script_flags.reader_flags`), else by the rules below (ours: names and
reasons only). Writes ``src/autopar/data/script_flags.json`` and ``docs/script_flags.md``.
Rerun after the reader learns a flag, so the table says ``modelled`` (``--from-table`` does so
from the packaged table alone, without the framework copies).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from script_flags_extract import Source, git, read_source  # noqa: E402
from script_flags_md import markdown  # noqa: E402
from script_flags_rules import classify  # noqa: E402

from autopar.specs.script_flags import reader_flags  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIRROR = Path("/work/.mirror")
MEGATRON_TAG = "v0.15.3"
TABLE_PATH = ROOT / "src/autopar/data/script_flags.json"


def main() -> None:
    """Read the three parsers, classify, write the JSON table and the Markdown page."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron", default=str(MIRROR / "NVIDIA+Megatron-LM/repo"))
    p.add_argument("--megatron-rev", default=MEGATRON_TAG)
    p.add_argument("--mindspeed-llm", default=str(MIRROR / "Ascend+MindSpeed-LLM/repo"))
    p.add_argument("--mindspeed", default=str(MIRROR / "Ascend+MindSpeed/repo"))
    p.add_argument("--from-table", action="store_true",
                   help="reclassify the flags of the packaged table (after the reader or the rules changed) "
                        "without the framework copies")
    args = p.parse_args()
    if args.from_table:
        old = json.loads(TABLE_PATH.read_text())
        meta = old["sources"]
        table = {f: dict(frameworks=e["frameworks"], groups=e["groups"]) for f, e in old["flags"].items()}
    else:
        table, meta = read_frameworks(args)
    write(table, meta)


def read_frameworks(args: argparse.Namespace) -> tuple[dict[str, dict], dict[str, dict]]:
    """``(flag -> {"frameworks", "groups"}, source key -> its name, version, commit and files)``."""
    sources = {
        "megatron": (Source("megatron", args.megatron, args.megatron_rev, ("megatron/training/arguments.py",)),
                     "Megatron-LM"),
        "mindspeed_llm": (Source("mindspeed", args.mindspeed_llm, "HEAD",
                                 ("mindspeed_llm/training/arguments.py", "mindspeed_llm/features_manager/")),
                          "MindSpeed-LLM"),
        "mindspeed": (Source("mindspeed", args.mindspeed, "HEAD", ("mindspeed/arguments.py", "mindspeed/features_manager/")),
                      "MindSpeed"),
    }
    table: dict[str, dict] = {}
    meta = {}
    for key, (src, name) in sources.items():
        commit = git(src.git_dir, "rev-parse", f"{src.rev}^{{commit}}").strip()
        date = git(src.git_dir, "log", "-1", "--format=%cs", commit).strip()
        version = f"{src.rev} ({commit[:12]}, {date})" if src.rev != "HEAD" else f"{commit[:12]} ({date})"
        meta[key] = dict(name=name, version=version, commit=commit, files=list(src.prefixes))
        for flag, group in read_source(src).items():
            entry = table.setdefault(flag, dict(frameworks=[], groups=[]))
            entry["frameworks"].append(key)
            entry["groups"].append(group)
    return table, meta


def write(table: dict[str, dict], meta: dict[str, dict]) -> None:
    """Classify ``table`` in place and write the JSON table and the Markdown page."""
    read = reader_flags()
    for flag, entry in sorted(table.items()):
        if flag in read:
            entry.update(cls="modelled", reason="read by autopar's script reader")
        else:
            cls, reason, only = classify(flag, entry["groups"])
            entry.update(cls=cls, reason=reason)
            if only:
                entry["only"] = list(only)
    flags = {f: {"class": e.pop("cls"), **e} for f, e in sorted(table.items())}
    for key, m in meta.items():
        m["count"] = sum(1 for e in flags.values() if key in e["frameworks"])
    doc = {"sources": meta, "flags": flags}
    TABLE_PATH.write_text(json.dumps(doc, indent=1) + "\n")
    (ROOT / "docs").mkdir(exist_ok=True)
    (ROOT / "docs/script_flags.md").write_text(markdown(doc))
    for key in meta:
        counts = {c: sum(1 for e in flags.values() if key in e["frameworks"] and e["class"] == c)
                  for c in ("modelled", "no_effect", "refused")}
        print(key, counts, "total", sum(counts.values()))


if __name__ == "__main__":
    main()
