"""The vocabulary size a launch script trains with: ``--vocab-size``, else the tokenizer files it
names that autopar can read (a Hugging Face tokenizer folder's ``config.json``, a GPT-2 BPE
``vocab.json``). A SentencePiece model file is not read: the caller then asks for ``--vocab-size``.

``--padded-vocab-size P`` (Megatron-LM ``_add_tokenizer_args``; MindSpeed-LLM's tokenizer feature)
is the embedding and output-layer size itself: ``build_tokenizer`` pads the tokenizer's vocabulary
to a multiple of ``--make-vocab-size-divisible-by`` x tp only when it is not given
(``megatron/training/tokenizer/tokenizer.py``; ``mindspeed_llm/training/tokenizer/tokenizer.py``:
``if getattr(args, "padded_vocab_size", None) is None``), and ``GPTModel`` is built with
``vocab_size=args.padded_vocab_size``. :func:`padded_vocab_size` reads it.

``--tokenizer-type NullTokenizer`` (synthetic data) makes the vocabulary ``--vocab-size`` itself on
Megatron-LM main (``megatron/core/tokenizers/text/libraries/null_tokenizer.py``: ``vocab_size``
returns ``self._vocab_size``, the end-of-document token is ``vocab_size - 1``, since #4057,
2026-04-22), but ``--vocab-size`` + 1 on the Megatron-Core MindSpeed-LLM runs (core_v0.12.1,
``megatron/training/tokenizer/tokenizer.py`` ``_NullTokenizer.vocab_size``: ``return
self._vocab_size_without_eod + 1``, the end-of-document token appended):
:func:`null_tokenizer_vocab`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError
from autopar.specs.bash import unknown_reason
from autopar.specs.script_launch import Args


def vocab_size(a: Args, path: Path) -> tuple[int | None, str | None]:
    """The vocabulary size and, when it cannot be determined, the error text asking for it.

    Args:
        a: the training script's arguments.
        path: the launch script (tokenizer paths are tried from the working directory, then from
            the script's folder).
    Raises:
        AutoparError: a named tokenizer file that cannot be read as a JSON object, a ``config.json``
            without an integer ``vocab_size`` >= 1, or an empty ``vocab.json``.
    """
    if a.has("--vocab-size"):
        return a.integer("--vocab-size"), None
    for flag in ("--tokenizer-name-or-path", "--tokenizer-model", "--vocab-file"):
        where = a.values.get(flag)
        if not where or unknown_reason(where[0]):
            continue
        for base in (Path.cwd(), path.parent):
            file = base / where[0]
            if not _exists(file):
                continue
            config = file / "config.json" if file.is_dir() else None
            if config and config.is_file():
                vocab = _read_json(a, config, flag).get("vocab_size")
                if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
                    raise AutoparError(f"{a.source}: {flag} {where[0]}: {str(config)!r} has vocab_size={vocab!r}, "
                                       "expected an integer >= 1; pass --vocab-size N")
                return vocab, None
            if flag == "--vocab-file" and file.suffix == ".json" and file.is_file():
                tokens = len(_read_json(a, file, flag))
                if not tokens:
                    raise AutoparError(f"{a.source}: {flag} {str(file)!r} holds no tokens; pass --vocab-size N")
                return tokens, None
    kind = a.text("--tokenizer-type", "an unknown tokenizer")
    return None, (f"{a.source}: the vocabulary size is unknown ({kind} reads it from a tokenizer file autopar "
                  "does not open); add --vocab-size N to the script or pass --vocab-size N to autopar")


def _exists(file: Path) -> bool:
    """Whether ``file`` exists; False for a name the file system cannot hold (a 300-character
    ``--tokenizer-model``: ``Path.is_dir`` raised ``OSError: File name too long``)."""
    try:
        return file.exists()
    except OSError:
        return False


def _read_json(a: "Args", file: Path, flag: str) -> dict[str, Any]:
    """A tokenizer's ``config.json`` or GPT-2 ``vocab.json`` (token -> id): a JSON object.

    Raises:
        AutoparError: unreadable, not UTF-8, not JSON, or not an object.
    """
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError, RecursionError) as err:  # JSONDecode/UnicodeDecodeError are ValueErrors
        raise AutoparError(f"{a.source}: {flag} {str(file)!r}: cannot read it as JSON "
                           f"({' '.join(str(err).split())}); pass --vocab-size N") from None
    if not isinstance(doc, dict):
        raise AutoparError(f"{a.source}: {flag} {str(file)!r} holds a JSON {type(doc).__name__}, expected an "
                           "object; pass --vocab-size N")
    return doc


def padded_vocab_size(a: Args, vocab: int | None, tp: int) -> int | None:
    """``--padded-vocab-size`` (module docstring), None without it: the model's vocabulary is then
    this size with no further padding (``make_vocab_size_divisible_by`` 1), as Megatron-LM's own
    FLOPs count (``num_floating_point_operations``) takes ``args.padded_vocab_size``.

    Raises:
        AutoparError: below 1, below the vocabulary ``vocab`` read from ``--vocab-size`` or the
            tokenizer (token ids past the embedding), or not divisible by tp (Megatron-Core's
            ``VocabParallelEmbedding`` splits the rows evenly: ``divide`` asserts it).
    """
    if not a.has("--padded-vocab-size"):
        return None
    padded = a.size("--padded-vocab-size")
    if vocab is not None and padded < vocab:
        raise AutoparError(f"{a.source}: --padded-vocab-size={padded} is below the vocabulary size {vocab}: token ids "
                           "past the embedding; give at least the vocabulary size")
    if padded % tp:
        raise AutoparError(f"{a.source}: --padded-vocab-size={padded} is not divisible by "
                           f"--tensor-model-parallel-size={tp}: Megatron-Core's VocabParallelEmbedding asserts "
                           f"'{padded} is not divisible by {tp}' (megatron/core/utils.py ensure_divisibility)")
    return padded


def null_tokenizer_vocab(a: Args, vocab: int | None, framework: str) -> int | None:
    """The vocabulary a script's tokenizer builds from ``vocab`` (its ``--vocab-size``): ``vocab`` + 1
    for ``--tokenizer-type NullTokenizer`` read as MindSpeed-LLM (``framework`` ``mindspeed``; module
    docstring), else ``vocab`` (Megatron-LM main's NullTokenizer, and every other tokenizer)."""
    if vocab is not None and framework == "mindspeed" and a.text("--tokenizer-type") == "NullTokenizer" \
            and a.has("--vocab-size"):
        return vocab + 1
    return vocab
