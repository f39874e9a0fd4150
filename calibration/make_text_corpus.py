"""Write ``recipes/data/text/english.txt``: English prose from the docstrings of Python standard-library modules.

    python -m qdeploy.calibration.make_text_corpus [OUT] [--max-bytes 90000]

The text comes from ``inspect.getdoc`` of a fixed list of modules and of their public functions and classes, in
a fixed order, so the file is the same for one Python version (3.11 wrote the shipped one).  Docstrings are
Python's own documentation, under the PSF licence, which allows redistribution; the file's first line says so.
Lines that look like code, doctest lines (``>>>``, ``...``) and lines shorter than ``MIN_LINE`` characters are
dropped: what remains is prose a tokenizer of English text splits as it would split any.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import re
import sys
from pathlib import Path

__all__ = ["MIN_LINE", "MODULES", "corpus", "prose_lines"]

log = logging.getLogger(__name__)

MODULES = ("abc", "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "copy",
           "csv", "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "functools", "glob",
           "gzip", "hashlib", "heapq", "html.parser", "http.client", "inspect", "io", "itertools", "json", "logging",
           "mailbox", "math", "os", "pathlib", "pickle", "queue", "random", "re", "sched", "shutil", "smtplib",
           "socket", "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap",
           "threading", "timeit", "tokenize", "trace", "typing", "unittest", "urllib.parse", "uuid", "warnings",
           "weakref", "zipfile")
"""Pure-documentation sources, in the order they are read."""
MIN_LINE = 40
HEADER = ("# English prose from the docstrings of Python {version} standard-library modules (Python Software "
          "Foundation License); written by qdeploy/calibration/make_text_corpus.py")
_CODE = re.compile(r"^\s*(>>>|\.\.\.|[-=*#]{3,}|\$ |[A-Za-z_][\w.]*\(.*\)\s*(->.*)?$)"  # doctest, rules, calls
                   r"|[{}\[\]<>|\\`]|==|\w+=\w|\w\.\w+\(")  # brackets, comparisons, keyword args, method calls


def prose_lines(doc: str) -> list[str]:
    """The lines of a docstring that read as prose: no code, no doctest, no short or indented lines."""
    kept = []
    for line in doc.splitlines():
        text = line.strip()
        if len(text) < MIN_LINE or line.startswith("    ") or _CODE.search(line) or not text[0].isalpha():
            continue
        kept.append(text)
    return kept


def _docs(name: str) -> list[str]:
    module = importlib.import_module(name)
    docs = [inspect.getdoc(module) or ""]
    for attr in sorted(getattr(module, "__all__", None) or dir(module)):
        value = getattr(module, attr, None)
        if attr.startswith("_") or not (inspect.isfunction(value) or inspect.isclass(value)):
            continue
        if getattr(value, "__module__", "").split(".")[0] != name.split(".")[0]:
            continue  # documented where it is defined
        docs.append(inspect.getdoc(value) or "")
    return docs


def corpus(max_bytes: int = 90_000) -> str:
    """The corpus text, header included, cut at a paragraph boundary at about ``max_bytes`` bytes."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    parts, size, seen = [HEADER.format(version=version)], 0, set()
    for name in MODULES:
        for doc in _docs(name):
            paragraph = " ".join(prose_lines(doc))
            if not paragraph or paragraph in seen:
                continue
            seen.add(paragraph)
            size += len(paragraph.encode()) + 2
            if size > max_bytes:
                return "\n\n".join(parts).rstrip() + "\n"
            parts.append(paragraph)
    return "\n\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", default=Path("recipes/data/text/english.txt"))
    parser.add_argument("--max-bytes", type=int, default=90_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    text = corpus(args.max_bytes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    log.info("%s: %d bytes, %d paragraphs", args.out, len(text.encode()), text.count("\n\n"))


if __name__ == "__main__":
    main()
