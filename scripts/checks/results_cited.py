#!/usr/bin/env python3
"""Keeps bench/results/ to what the course cites, listed in its manifest, and no older than the code it
measures.

    results_cited.py [ROOT]    (ctest: cpu_results_cited)

Three checks, each printing what fails it:

  cited     every file in bench/results/ is read by the table generator (scripts/docs/tables/) or named
            by a page: README.md, stages/*/README.md, docs/**/*.md, notebooks/, exercises/. A file is
            matched by its name, so that a reader can grep for it. The files that fail are printed one
            a line, ready to be deleted.
  manifest  bench/results/MANIFEST.md has one row per file in the folder, and names no file that is not
            there.
  fresh     for each manifest row with a commit C and `measures` paths P, the code under P is unchanged
            from C to HEAD (`git diff C HEAD -- P`). Changes to Markdown files (the lessons) and to
            comments only do not count: they do not change what the kernels do. Nor does a change that
            a SASS record proves left the device code as it was: bench/results/sass_unchanged_*.txt,
            written by scripts/profile/sass_unchanged.sh, compares the kernels of some .cu files
            compiled at a commit BASE and at a commit H. A result stays fresh when the code under P is
            unchanged from C to BASE, every file under P that changes from BASE to H is included by a
            compiled file whose kernels are all identical (the record's "all identical", H committed;
            a kernel only H has, a new template instance, is not one that C measured),
            and the code under P is unchanged from H to HEAD; records chain, H to the next one's BASE.
            The record covers device code only: a host-side change in its span (a launch's grid, a
            benchmark's constants) is for the reader of its diff to judge. Without git history (a
            tarball), or without any of the manifest's commits (a shallow clone, a copy of the tree
            committed afresh), this part says it was not checked, and why.

A page names a file by its whole name, or by its stem and `.*` for all of its forms
(`compare_h100_bf16.*`).

Exit 0 when all three hold, 1 otherwise.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]).resolve()
RESULTS = ROOT / "bench/results"
MANIFEST = RESULTS / "MANIFEST.md"
GENERATOR = ROOT / "scripts/docs/tables"
PAGE_GLOBS = ("README.md", "stages/*/README.md", "docs/**/*.md", "notebooks/**/*", "exercises/**/*")
CODE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c", ".py", ".txt", ".cmake"}


def pages():
    seen = set()
    for pattern in PAGE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file() and path not in seen and "/build" not in str(path.relative_to(ROOT)):
                seen.add(path)
                yield path


def read(path):
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


def generator_reads():
    """The names of the files under bench/results/ that the table generator opens while it makes every table
    and every inline figure the pages ask for (some of its file names are built from a head_dim or a
    dtype, so its source alone does not tell)."""
    sys.path.insert(0, str(ROOT / "scripts/docs"))
    import tables as generator
    opened = set()
    read_text, open_ = pathlib.Path.read_text, pathlib.Path.open

    def note(path):
        if path.resolve().parent == RESULTS:
            opened.add(path.name)

    def read_text_noted(self, *args, **kwargs):
        note(self)
        return read_text(self, *args, **kwargs)

    def open_noted(self, *args, **kwargs):
        note(self)
        return open_(self, *args, **kwargs)

    pathlib.Path.read_text, pathlib.Path.open = read_text_noted, open_noted
    try:
        generator.tables()
        values = generator.Values()
        for page in pages():
            for spec in re.findall(r"<!-- value:([\w./+-]+) -->", read(page)):
                try:
                    values[spec]
                except SystemExit:  # a figure without its file: make_tables --check reports it
                    pass
    finally:
        pathlib.Path.read_text, pathlib.Path.open = read_text, open_
    return opened


def uncited(names):
    """The names that the generator does not read and no page mentions."""
    read_by_generator = generator_reads()
    text = "\n".join(read(p) for p in pages())
    return [n for n in names if n not in read_by_generator and n not in text
            and f"{n.rsplit('.', 1)[0]}.*" not in text]


def manifest_rows():
    """{file name: (commit, measures paths)} from MANIFEST.md's table."""
    rows = {}
    head = None
    for line in read(MANIFEST).splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # "\|" is a pipe in a cell
        if head is None:
            head = [c.lower() for c in cells]
            continue
        if set(line) <= set("|-: "):
            continue
        row = dict(zip(head, cells))
        name = row.get("file", "").strip("`")
        commit = row.get("commit", "-").strip("`")
        measures = [p.strip("`") for p in row.get("measures", "-").split() if p.strip("`") not in ("", "-")]
        rows[name] = (commit if re.fullmatch(r"[0-9a-f]{7,40}", commit) else None, measures)
    return rows


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def strip_comments(text, suffix):
    """The code of a file without its comments and blank space, to compare two versions by what they do."""
    if suffix == ".py":
        text = re.sub(r'"""(?:.|\n)*?"""', "", text)
        text = re.sub(r"#[^\n]*", "", text)
    elif suffix in (".txt", ".cmake"):
        text = re.sub(r"#[^\n]*", "", text)
    else:
        text = re.sub(r"/\*(?:.|\n)*?\*/", "", text)
        text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"\s+", "", text)


def code_changed(commit, paths, later="HEAD"):
    """The files under paths whose code differs between commit and later (comments and Markdown aside)."""
    changed = git("diff", "--name-only", commit, later, "--", *paths)
    if changed.returncode != 0:
        return None, changed.stderr.strip()
    out = []
    for name in changed.stdout.split():
        suffix = pathlib.PurePath(name).suffix
        if suffix == ".md":
            continue
        if suffix not in CODE_SUFFIXES:
            out.append(name)
            continue
        old, new = git("show", f"{commit}:{name}"), git("show", f"{later}:{name}")
        if old.returncode or new.returncode or strip_comments(old.stdout, suffix) != strip_comments(new.stdout, suffix):
            out.append(name)
    return out, None


def sass_records():
    """The comparisons of scripts/profile/sass_unchanged.sh kept in bench/results/sass_unchanged_*.txt, each
    as (base, tree, the files the identical sources include). A file holds one comparison per "# command:"
    line; one whose tree had uncommitted changes, or where a kernel differs, proves nothing and is left out."""
    records = []
    for path in sorted(RESULTS.glob("sass_unchanged_*.txt")):
        for block in re.split(r"^(?=# command:)", read(path), flags=re.M):
            base = re.search(r"^base: ([0-9a-f]{7,40})$", block, re.M)
            tree = re.search(r"^tree: ([0-9a-f]{7,40}) \(", block, re.M)
            if not base or not tree or not re.search(r"^all identical", block, re.M):
                continue
            covered = set()
            for source in re.finditer(r"^file (\S+)\n  includes: (.*)\n(?:  .*\n)*?  \1: identical", block, re.M):
                covered.update(source.group(2).split())
            records.append((base.group(1), tree.group(1), covered))
    return records


def unchanged_through_records(commit, paths, records):
    """Whether the code under paths is the same at HEAD as at commit, counting a span BASE..H of a SASS record
    as no change where every file it changes under paths is included by a source that compiled to the same
    SASS. Spans chain: commit to a BASE without a code change, BASE to H covered, H on to the next BASE or
    to HEAD without a code change."""
    reached, frontier = {commit}, [commit]
    while frontier:
        start = frontier.pop()
        if code_changed(start, paths) == ([], None):
            return True
        for base, tree, covered in records:
            if tree in reached or code_changed(start, paths, base) != ([], None):
                continue
            span, error = code_changed(base, paths, tree)
            if error is None and set(span) <= covered:
                reached.add(tree)
                frontier.append(tree)
    return False


def main():
    names = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "MANIFEST.md")
    failed = False

    missing = uncited(names)
    if missing:
        failed = True
        print(f"cited: {len(missing)} of {len(names)} files in bench/results/ are read by no table and named by no page:")
        for n in missing:
            print(f"  bench/results/{n}")
    else:
        print(f"cited: every one of the {len(names)} files in bench/results/ is read or named")

    rows = manifest_rows() if MANIFEST.exists() else {}
    if not MANIFEST.exists():
        failed = True
        print("manifest: bench/results/MANIFEST.md does not exist")
    else:
        absent = [n for n in names if n not in rows]
        extra = [n for n in rows if n not in names]
        for n in absent:
            print(f"manifest: bench/results/{n} has no row in MANIFEST.md")
        for n in extra:
            print(f"manifest: MANIFEST.md names {n}, which bench/results/ does not have")
        failed |= bool(absent or extra)
        if not absent and not extra:
            print(f"manifest: {len(rows)} rows, one per file")

    commits = {commit for commit, paths in rows.values() if commit and paths}
    known = {c for c in commits if git("cat-file", "-e", f"{c}^{{commit}}").returncode == 0}
    if not (ROOT / ".git").exists() or git("rev-parse", "HEAD").returncode != 0:
        print("fresh: not checked: no git history here (a tarball), so the commit each result measured "
              "cannot be compared with the code")
    elif commits and not known:
        # A copy of the tree with a history of its own (a shallow clone, a snapshot committed afresh):
        # none of the manifest's commits is here. One unknown commit among known ones is a typo: below.
        print(f"fresh: not checked: this clone holds none of the {len(commits)} commits the manifest names "
              "(a shallow clone or a copy of the tree); a full clone checks them")
    else:
        stale = 0
        records = sass_records()
        for name, (commit, paths) in sorted(rows.items()):
            if not commit or not paths or name not in names:
                continue
            changed, error = code_changed(commit, paths)
            if changed and unchanged_through_records(commit, paths, records):
                continue
            if error:
                stale += 1
                print(f"fresh: bench/results/{name}: cannot compare {commit} with HEAD: {error}")
            elif changed:
                stale += 1
                print(f"fresh: bench/results/{name} measured {' '.join(paths)} at {commit}; the code has changed "
                      f"since: {', '.join(changed)}")
        failed |= bool(stale)
        if not stale:
            print("fresh: every result that measures the current code was written by that code")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
