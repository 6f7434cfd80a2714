#!/usr/bin/env python3
"""Keeps the repository's text about its subject: attention kernels, their lessons and their
measurements. Words about how the repository itself was worked on do not belong in it: the word for
a sitting of work, a device run named by its number, runs named by their order, issue-tracker
numbers, and names of git branches other than main. A measurement is named by what it measures and
by the file under bench/results/ that holds it.

    process_words.py [ROOT]    (ctest: cpu_no_process_words)

It reads every file git knows in ROOT (tracked, plus untracked ones that .gitignore lets through),
or, without git, every file under ROOT except .git/ and build*/ folders. It checks each path, and
the content of each text file; the JSON and CSV files under bench/results/ are results data, so only
their names are checked. A file is text when it decodes as UTF-8 and holds no NUL byte. Each hit is
printed as file:line: matched text (line 0 is the path itself). Exit 0 when there is none, 1 otherwise.
"""
import pathlib
import re
import subprocess
import sys

# The patterns are assembled from pieces so that this file's own text does not match them. "First
# call" and "first run" stay out of the ordinals: they are how one speaks of a cold start.
_WORK = "ses" + "sions?"
_ORDINALS = (
    "second|third|fourth|fifth|sixth|seventh|eighth|ninth|ten" "th|eleven" "th|twelf" "th|thir" "teenth|"
    "four" "teenth|fif" "teenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"\d+(?:st|nd|rd|th)"
)
PATTERNS = [
    re.compile(r"(?<!test )\b" + _WORK + r"\b", re.IGNORECASE),  # pytest's "test s..." banner is the tool's own
    # Not a command-line option's count (a "--" right before the word).
    re.compile(r"(?<!-)\bcal" + r"ls?\s+\d+", re.IGNORECASE),
    re.compile(r"\b(?:" + _ORDINALS + r")\s+(?:" + "ses" + "sion|cal" + "l|ru" + r"n)\b", re.IGNORECASE),
    re.compile(r"\bthe\s+ru" + r"n\s+before\b", re.IGNORECASE),
    # Not "a warpgroup issues 32 loads" nor "issue 40.5%": a number followed by a word other than a
    # joining one, or with a fraction or a percent sign, is a count or a rate.
    re.compile(r"\biss" + r"ues?\s+#?\d+\b(?![.%]\d|%)(?!\s+(?!(?:and|or|to|erratum)\b)[a-z])", re.IGNORECASE),
    re.compile(r"\(iss" + r"ues?\b", re.IGNORECASE),
    re.compile(r"\bbran" + r"ch(?:es)?\s+[`'\"]?[a-z0-9][a-z0-9._/-]*-[a-z0-9-]+", re.IGNORECASE),
]
# Results data: names checked, content not.
DATA_DIR = "bench/results/"
DATA_SUFFIXES = (".json", ".csv")
BINARY_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".pdf", ".ico")


def listed_files(root):
    """Paths relative to root, as posix strings."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True).stdout
        return sorted({p for p in out.decode("utf-8", "replace").split("\0") if p})
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if rel.parts[0] == ".git" or any(part.startswith("build") for part in rel.parts[:-1]):
                continue
            if path.is_file():
                paths.append(rel.as_posix())
        return sorted(paths)


def name_as_words(rel):
    """A path read as words: separators become spaces, and digits part from letters ("call3")."""
    words = re.sub(r"[_\-./]+", " ", rel)
    return re.sub(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])", " ", words)


def hits_in(text):
    """(line, matched text) for each hit; a phrase may wrap onto the next line."""
    found = []
    for pattern in PATTERNS:
        for match in pattern.finditer(text):
            found.append((text.count("\n", 0, match.start()) + 1, " ".join(match.group(0).split())))
    return sorted(found)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    hits = 0
    for rel in listed_files(root):
        path = root / rel
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        for _, found in hits_in(name_as_words(rel)):
            print(f"{rel}:0: {found}")
            hits += 1
        lower = rel.lower()
        if lower.endswith(BINARY_SUFFIXES) or (lower.startswith(DATA_DIR) and lower.endswith(DATA_SUFFIXES)):
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for number, found in hits_in(text):
            print(f"{rel}:{number}: {found}")
            hits += 1
    if hits:
        print(f"process_words.py: {hits} hit(s): name the subject instead (what was measured, the "
              "file that holds it)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
