#!/usr/bin/env python3
"""Builds the Markdown pages of the documentation site into the build tree.

The sources stay readable on their own (GitHub renders docs/mainpage.md, docs/theory/*.md,
docs/results.md, docs/experiments/*.md and every stages/NN_*/README.md with $...$ math and relative
links). This script turns them into Doxygen pages:

    build_site.py pages --root <repo> --out <dir>     Markdown pages + generated diffs under <dir>
    build_site.py mathjax --src <mathjax> --dest <dir> the parts of MathJax 2 the site loads

`pages` writes
    <out>/mainpage.md             the course map; its stage table gets links and measured speedups,
                                  its <!-- table:NAME --> regions are filled by scripts/docs/make_tables.py
    <out>/theory/theory_NN.md     docs/theory/NN_*.md
    <out>/lessons/lesson_NN.md    stages/NN_*/README.md (a stub page where there is none yet),
                                  followed by the diff of the stage's kernel against the previous one
    <out>/diffs/lesson_NN_diff.html  that diff, as HTML, computed here from the .cu sources
    <out>/pages/*.md              docs/results.md, docs/copy_a_stage.md (each where it exists) and the
                                  experiments page, parent of one page per docs/experiments/*.md
    <out>/experiments/*.md        those pages
Each page gets a Doxygen label (lesson_NN, theory_NN, results, copy_a_stage, experiments,
experiments_NAME), $-math becomes \\f$..\\f$, relative links become @ref links or plain code paths, so
that nothing on the site points outside it. Stage order and the set of stages come from the folder
names under stages/ at build time; the set of experiments pages from the files under docs/experiments/.
"""
import argparse
import difflib
import html
import importlib.util
import pathlib
import re
import shutil
import sys

STAGE_DIR = re.compile(r"^(\d\d)_(\w+)$")
THEORY_FILE = re.compile(r"^(\d\d)_[\w-]+\.md$")
COURSE_SEQ = 4096  # the course table's problem: batch 4, 16 heads, seq 4096 (scripts/docs/make_tables.py)


# ---------------------------------------------------------------------------------------------
# What exists: stages, their headers and kernels, theory pages
# ---------------------------------------------------------------------------------------------

class Stage:
    def __init__(self, path):
        m = STAGE_DIR.match(path.name)
        self.path = path
        self.number = int(m[1])
        self.folder = path.name
        self.label = f"lesson_{m[1]}"
        self.kernels = sorted(path.glob("*.cu"))
        self.headers = sorted(path.glob("*.h"))
        self.readme = path / "README.md"

    @property
    def idea(self):
        """The first sentence of the public header's opening comment, after 'Stage NN:'."""
        for header in self.headers:
            lines = []
            for line in header.read_text().splitlines():
                if not line.startswith("//"):
                    break
                lines.append(line[2:].strip())
            text = " ".join(lines)
            text = re.sub(r"^Stage\s+\d+\s*:\s*", "", text)
            sentence = re.split(r"(?<=\.)\s", text, maxsplit=1)[0].rstrip(".")
            if sentence:
                return sentence[0].upper() + sentence[1:]
        return self.folder[3:].replace("_", " ")

    @property
    def title(self):
        if self.readme.exists():
            for line in self.readme.read_text().splitlines():
                m = re.match(r"^#\s+(.*?)\s*(\{#[\w-]+\})?\s*$", line)
                if m:
                    return m[1]
        return f"Stage {self.number:02d}: {self.idea}"


def find_stages(root):
    stages_dir = root / "stages"
    return [Stage(p) for p in sorted(stages_dir.iterdir()) if p.is_dir() and STAGE_DIR.match(p.name)]


def find_theory(root):
    return sorted(p for p in (root / "docs/theory").glob("*.md") if THEORY_FILE.match(p.name))


def theory_label(path):
    return "theory_" + path.name[:2]


class OtherPage:
    """A page of docs/ beside the course map, the theory and the lessons: the results, the recipe for
    copying a stage, the experiments page (docs/experiments/README.md where there is one, else a page
    made here) and one page per docs/experiments/*.md."""

    def __init__(self, src, label, out, default_title=None, toc=True):
        self.src, self.label, self.out, self.default_title = src, label, out, default_title
        self.toc = toc  # Doxygen's table of contents, for a page that has none of its own

    @property
    def title(self):
        return page_title(self.src) if self.src.exists() else self.default_title


EXPERIMENTS_INTRO = ("What was tried on the stages, kept or not, each with its measured result and the "
                     "file of `bench/results/` that holds it. The lessons describe the kernels as they are; "
                     "these pages say how they got there.")


def find_other_pages(root):
    """(top-level pages in the order the site lists them, the experiments pages under the experiments page)."""
    docs = root / "docs"
    # The file names under <out>/pages/ order the site's tree: Doxygen reads a folder's files sorted.
    top = [OtherPage(docs / name, label, f"pages/{order}_{label}.md", toc=toc)
           for order, name, label, toc in [(1, "results.md", "results", False),
                                           (3, "copy_a_stage.md", "copy_a_stage", True)]
           if (docs / name).exists()]
    found = sorted(p for p in (docs / "experiments").glob("*.md") if p.name != "README.md")
    experiments = [OtherPage(p, "experiments_" + re.sub(r"[^A-Za-z0-9_]", "_", p.stem), f"experiments/{p.stem}.md")
                   for p in found]
    if experiments or (docs / "experiments/README.md").exists():
        top.insert(1, OtherPage(docs / "experiments/README.md", "experiments", "pages/2_experiments.md",
                                default_title="Experiments"))
    return top, experiments


def load_make_tables(root):
    """scripts/docs/make_tables.py, imported as a module (the one source of every measured figure)."""
    spec = importlib.util.spec_from_file_location("make_tables", root / "scripts/docs/make_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# GitHub Markdown -> Doxygen Markdown
# ---------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def split_fences(text):
    """[(is_code, language, chunk)]: fenced code blocks apart from the prose around them."""
    parts, buf, in_code, fence, lang = [], [], False, "", ""
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        if not in_code and m:
            if buf:
                parts.append((False, "", "".join(buf)))
            buf, in_code, fence, lang = [line], True, m[2], m[3]
        elif in_code and line.strip().startswith(fence[0] * len(fence)) and line.strip().strip(fence[0]) == "":
            buf.append(line)
            parts.append((True, lang, "".join(buf)))
            buf, in_code = [], False
        else:
            buf.append(line)
    if buf:
        parts.append((in_code, lang, "".join(buf)))
    return parts


# Inline code spans, display math, inline math (pandoc/GitHub rules: no space inside the dollars,
# the closing dollar not followed by a digit), in that order of precedence.
INLINE = re.compile(r"(?P<code>(`+)(?:.+?)\2)"
                    r"|(?P<display>\$\$(?P<dbody>.+?)\$\$)"
                    r"|(?P<inline>(?<![\\$])\$(?=[^\s$])(?P<ibody>(?:\\.|[^$\\])+?)(?<=[^\s\\])\$(?!\d))",
                    re.S)


def github_slug(heading):
    slug = re.sub(r"[`*_]|\\f\$|\$", "", heading.strip().lower())
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


class PageContext:
    """What link rewriting needs to know about the site."""

    def __init__(self, root, stages, theory, headers, others=()):
        self.root = root
        self.lessons = {s.path.resolve(): s.label for s in stages}
        self.theory = {p.resolve(): theory_label(p) for p in theory}
        self.others = {o.src.resolve(): o.label for o in others}
        if any(o.label == "experiments" for o in others):  # a link to the folder itself
            self.others[(root / "docs/experiments").resolve()] = "experiments"
        self.headers = {p.resolve(): p.name for p in headers}
        self.mainpage = (root / "docs/mainpage.md").resolve()
        self.anchors = {}  # page label -> {github slug: doxygen label}

    def target(self, src, link):
        """A Doxygen link target for a relative link in src, or None where the site has no page."""
        path, _, frag = link.partition("#")
        if not path:
            label = self.page_of(src)
            return "@ref " + self.anchor(label, frag) if label else None
        dest = (src.parent / path).resolve()
        if dest == self.mainpage:
            return "@ref index"
        if dest in self.theory:
            return "@ref " + self.anchor(self.theory[dest], frag)
        if dest in self.others:
            return "@ref " + self.anchor(self.others[dest], frag)
        if dest.name == "README.md" and dest.parent in self.lessons:
            return "@ref " + self.anchor(self.lessons[dest.parent], frag)
        if dest in self.lessons:  # a link to the stage's folder
            return "@ref " + self.lessons[dest]
        if dest in self.headers:
            return "@ref " + self.headers[dest]
        return None

    def page_of(self, src):
        src = src.resolve()
        if src == self.mainpage:
            return "index"
        if src in self.theory:
            return self.theory[src]
        if src in self.others:
            return self.others[src]
        if src.name == "README.md" and src.parent in self.lessons:
            return self.lessons[src.parent]
        return None

    def anchor(self, label, frag):
        """The Doxygen label of heading #frag on page label. An unknown heading gives a label Doxygen
        cannot resolve, so the broken link is a warning (an error in CI) rather than a silent jump."""
        if not frag:
            return label
        return self.anchors.get(label, {}).get(frag, f"{label}_{re.sub(r'[^A-Za-z0-9_]', '_', frag)}")

    def repo_path(self, src, link):
        dest = (src.parent / link.partition("#")[0]).resolve()
        try:
            return dest.relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return link


LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<url>[^)\s]+)\)")


# Bold text that holds a formula: Doxygen's Markdown gives up on **...** once a \f$ command is inside
# and prints the asterisks, so such spans become HTML bold, which it renders with the formula. The same
# happens to bold that opens with a code span.
BOLD_MATH = re.compile(r"\*\*(?=[^*\n]*\$|`)([^*\n]+?)\*\*")


# A picture on a line of its own, ![caption](path/to/docs/diagrams/NAME.svg) or a plot of the measured
# results, ![caption](path/to/bench/results/NAME.png): Doxygen copies it into the site from IMAGE_PATH
# (docs/diagrams and bench/results, see Doxyfile.in) when it is written as an \\image command.
DIAGRAM = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<path>[^)\s]*(?:diagrams/(?P<svg>[\w.-]+\.svg)|"
                     r"bench/results/(?P<png>[\w.-]+\.png)))\)[ \t]*$", re.M)


def convert_prose(chunk, src, ctx):
    """Math, links and Doxygen-special characters of a prose chunk (outside fenced code)."""
    chunk = BOLD_MATH.sub(r"<b>\1</b>", chunk)
    images = []

    def image(m):
        images.append(f'\\image html {m["svg"] or m["png"]} "{m["alt"].replace(chr(34), chr(39))}"')
        return f"DIAGRAMPLACEHOLDER{len(images) - 1}X"

    chunk = DIAGRAM.sub(image, chunk)
    if images:
        converted = convert_prose(chunk, src, ctx)
        return re.sub(r"DIAGRAMPLACEHOLDER(\d+)X", lambda m: images[int(m[1])], converted)
    out, pos = [], 0
    for m in INLINE.finditer(chunk):
        out.append(convert_plain(chunk[pos:m.start()], src, ctx))
        if m["code"]:
            out.append(m["code"])
        elif m["display"]:
            out.append("\\f[" + m["dbody"] + "\\f]")
        else:
            out.append("\\f$" + m["ibody"] + "\\f$")
        pos = m.end()
    out.append(convert_plain(chunk[pos:], src, ctx))
    return "".join(out)


def convert_plain(text, src, ctx):
    # Markdown (not Doxygen) is what the author wrote: a backslash before a letter or an @ is text.
    text = re.sub(r"\\(?=[A-Za-z])", r"\\\\", text)
    text = re.sub(r"(?<![\\\w])@(?=[A-Za-z])", r"\\@", text)

    def link(m):
        url, label = m["url"], m["text"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.I) or url.startswith("//"):
            return m[0]  # an external link: left to the reader's network
        target = ctx.target(src, url)
        if target:
            return f"[{label}]({target})"
        path = ctx.repo_path(src, url)
        return label if label.strip("`") == path else f"{label} (`{path}`)"

    return LINK.sub(link, text)


HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*(\{#[\w-]+\})?\s*$")


TEX_WORDS = {"infty": "∞", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "cdot": "·", "times": "×",
             "to": "→", "sum": "Σ", "approx": "≈", "ne": "≠", "neq": "≠", "in": "∈", "circ": "∘",
             "alpha": "α", "beta": "β", "tau": "τ", "sigma": "σ", "partial": "∂", "top": "ᵀ", "quad": " "}
SUPERSCRIPTS = {"2": "²", "3": "³", "T": "ᵀ", "n": "ⁿ", "-1": "⁻¹"}


def tex_to_text(tex):
    """Plain text for a formula where Doxygen shows none (headings): -\infty -> -∞, N^2 -> N²."""
    text = re.sub(r"\\(mathrm|text|mathbf|operatorname)\{([^}]*)\}", r"\2", tex)
    text = re.sub(r"\\([A-Za-z]+)", lambda m: TEX_WORDS.get(m[1], m[1]), text)
    text = re.sub(r"\^\{?(-1|[23Tn])\}?", lambda m: SUPERSCRIPTS[m[1]], text)
    return text.replace("{", "").replace("}", "").replace("\\", "")


def heading_text(text, src, ctx):
    """A heading's text: Doxygen renders no formula in a title, so its math becomes plain text."""
    out, pos = [], 0
    for m in INLINE.finditer(text):
        out.append(text[pos:m.start()])
        out.append(m["code"] or tex_to_text(m["dbody"] or m["ibody"]))
        pos = m.end()
    out.append(text[pos:])
    return convert_plain("".join(out), src, ctx)


def collect_anchors(text, label):
    anchors = {}
    for is_code, _, chunk in split_fences(text):
        if is_code:
            continue
        for line in chunk.splitlines():
            m = HEADING.match(line)
            if m and len(m[1]) > 1:
                slug = github_slug(m[2])
                anchors[slug] = f"{label}_{slug.replace('-', '_')}"
    return anchors


def to_doxygen(text, src, label, ctx, title=None, toc=False):
    """The page's Markdown, ready for Doxygen: labelled title, anchors, math, links."""
    parts = split_fences(text)
    out, titled = [], False
    for is_code, lang, chunk in parts:
        if is_code:
            if lang == "math":  # GitHub's ```math block
                body = "".join(chunk.splitlines(keepends=True)[1:-1])
                out.append("\\f[\n" + body + "\\f]\n")
            else:
                out.append(chunk)
            continue
        lines = []
        for line in chunk.splitlines(keepends=True):
            m = HEADING.match(line.rstrip("\n"))
            if m and len(m[1]) == 1 and not titled:
                lines.append(f"# {heading_text(m[2], src, ctx)}" + ("" if label == "index" else f" {{#{label}}}") + "\n")
                if toc:
                    lines.append("\n[TOC]\n")
                titled = True
                continue
            if m:
                slug = github_slug(m[2])
                anchor = ctx.anchors.get(label, {}).get(slug)
                lines.append(f"{m[1]} {heading_text(m[2], src, ctx)}" +
                             (f" {{#{anchor}}}" if anchor else "") + "\n")
                continue
            lines.append(line)
        out.append(convert_prose("".join(lines), src, ctx))
    body = "".join(out).lstrip("\n")
    if not titled:
        body = f"# {title or label} {{#{label}}}\n\n" + body
    elif not body.startswith("# "):
        # Doxygen takes the page title from the first line only: move the title there.
        first = body.index("\n# ") + 1 if "\n# " in body else 0
        end = body.index("\n", first)
        body = body[first:end + 1] + "\n" + body[:first] + body[end + 1:]
    return body


def fill_tables(text, tables, where, values=None):
    """The <!-- table:NAME --> regions filled, and each inline <!-- value:SPEC -->figure<!-- /value -->
    replaced by its figure alone (the markers are for scripts/docs/make_tables.py, not for the reader)."""
    if values is not None:
        text = re.sub(r"<!-- value:([\w./+-]+) -->.*?<!-- /value -->", lambda m: values[m[1]], text, flags=re.S)

    def fill(m):
        name = m[1]
        if name not in tables:  # kept as committed: make_tables.py may not know it yet
            print(f"note: {where}: scripts/docs/make_tables.py has no table {name}; the region is left as written")
            return m[0]
        return f"<!-- table:{name} -->\n{tables[name]}\n<!-- /table:{name} -->"

    return re.sub(r"<!-- table:([\w-]+) -->.*?<!-- /table:\1 -->", fill, text, flags=re.S)


# ---------------------------------------------------------------------------------------------
# The stages whose diff is against another stage than the one before: the Hopper backward (14)
# against the tensor-core backward (11), the backward it moves onto Hopper, not the decoding stage.
DIFF_BASE = {14: 11}

# The generated diff of each stage's kernel against the previous stage's
# ---------------------------------------------------------------------------------------------

def pair_kernels(stage, prev):
    """(previous file or None, current file) for each kernel of the stage.

    One kernel each side: those two. Otherwise a kernel is compared with the previous stage's file of
    the same name, else with its most similar one; a file that resembles none (under a quarter of
    its lines in common) is new and shown whole.
    """
    if prev is None or not prev.kernels:
        return [(None, k) for k in stage.kernels]
    if len(stage.kernels) == 1 and len(prev.kernels) == 1:
        return [(prev.kernels[0], stage.kernels[0])]
    pairs = []
    for k in stage.kernels:
        same = [p for p in prev.kernels if p.name == k.name]
        if same:
            pairs.append((same[0], k))
            continue
        lines = k.read_text().splitlines()
        scored = [(difflib.SequenceMatcher(None, p.read_text().splitlines(), lines, autojunk=False).ratio(), p)
                  for p in prev.kernels]
        ratio, best = max(scored, key=lambda t: t[0])
        pairs.append((best if ratio >= 0.25 else None, k))
    return pairs


def diff_html(root, stage, prev):
    rel = lambda p: p.relative_to(root).as_posix()
    blocks = []
    for old, new in pair_kernels(stage, prev):
        new_lines = new.read_text().splitlines()
        if old is None:
            what = "the starting point" if prev is None else "new in this stage"
            head = f"<code>{html.escape(rel(new))}</code>: {what}, {len(new_lines)} lines"
            body = [("ctx", " " + line) for line in new_lines]
        else:
            old_lines = old.read_text().splitlines()
            diff = list(difflib.unified_diff(old_lines, new_lines, rel(old), rel(new), n=3, lineterm=""))
            added = sum(1 for d in diff[2:] if d.startswith("+"))
            removed = sum(1 for d in diff[2:] if d.startswith("-"))
            head = (f"<code>{html.escape(rel(old))}</code> &rarr; <code>{html.escape(rel(new))}</code>: "
                    f"{added} lines added, {removed} removed")
            kind = {"+": "add", "-": "del", "@": "hunk"}
            body = [(kind.get(d[:1], "ctx"), d) for d in diff[2:]] or [("ctx", " (identical)")]
        # One block-level span per line and no newline between them: <pre> would show it twice.
        rows = "".join(f'<span class="{k}">{html.escape(text) or " "}</span>' for k, text in body)
        blocks.append(f'<div class="stage-diff">\n<div class="diff-head">{head}</div>\n'
                      f'<pre class="diff">{rows}</pre>\n</div>')
    return "\n".join(blocks) + "\n"


# ---------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------

def measured_gain(runs, stage, decode=None):
    """What the stage buys, in measured figures from bench/results (via make_tables.load_bench; a decoding
    stage, which the prefill grid does not run, via make_tables.load_decode_bench)."""
    def get(n, d, causal):
        return runs.get((n, d, causal, COURSE_SEQ))

    numbers = sorted({k[0] for k in runs})
    dims = [d for d in (64, 128) if get(stage.number, d, False)]
    decoded = {k: r for k, r in (decode or {}).items() if r["stage"] == stage.number and k[0] == 0}
    if not dims and decoded:
        batch, seq_kv = (1, 131072) if (0, 1, 131072) in decoded else min(k[1:] for k in decoded)  # the first target shape
        r = decoded[(0, batch, seq_kv)]
        return (f"{r['gbs']:.0f} GB/s over K and V, decoding (batch {batch}, {seq_kv} keys, {r['hq']}/{r['hkv']} heads, "
                f"d = {r['d']}; `bench/results/h100_bench_decode.json`)")
    if not dims:
        return "not in `bench/results/` yet"
    which = f"(d = {' / '.join(map(str, dims))})"
    earlier = [n for n in numbers if n < stage.number and all(get(n, d, False) for d in dims)]
    if earlier:
        ratios = [get(stage.number, d, False)["tflops"] / get(earlier[-1], d, False)["tflops"] for d in dims]
        text = f"{' / '.join(f'{r:.2f}×' for r in ratios)} the speed of stage {earlier[-1]:02d} {which}"
    else:
        rates = [get(stage.number, d, False)["tflops"] for d in dims]
        text = f"{' / '.join(f'{r:.2f}' for r in rates)} TFLOP/s {which}"
    causal = [get(stage.number, d, True)["ms"] / get(stage.number, d, False)["ms"] for d in dims
              if get(stage.number, d, True)]
    if len(causal) == len(dims):
        text += f"; causal in {' / '.join(f'{c:.2f}×' for c in causal)} the non-causal time"
    return text


def course_map(text, stages, runs, decode=None):
    """Adds a lesson link and the measured column to the hand-written stage table of mainpage.md."""
    def rebuild(m):
        rows = {}
        for line in m[1].splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and re.fullmatch(r"\d\d", cells[0]):
                rows[int(cells[0])] = cells
        out = ["| Stage | The idea | What it buys | Measured (H100, seq 4096, fp32) |",
               "|---|---|---|---|"]
        for s in stages:
            idea, buys = (rows[s.number][1], rows[s.number][2]) if s.number in rows else (s.idea, "see the lesson")
            out.append(f"| [{s.number:02d}](@ref {s.label}) | {idea} | {buys} | {measured_gain(runs, s, decode)} |")
        out.append("")
        out.append("The measured column is computed when the site is built, from `bench/results/h100_bench.json` "
                   "(batch 4, 16 heads, non-causal unless it says causal).")
        return "<!-- course-map -->\n" + "\n".join(out) + "\n<!-- /course-map -->"

    return re.sub(r"<!-- course-map -->(.*?)<!-- /course-map -->", rebuild, text, flags=re.S)


def page_lists(text, stages, theory, titles, experiments=()):
    """The main page's lists of lessons, theory pages and experiments pages, as links to their pages."""
    lessons = "\n".join(f"- [{s.title}](@ref {s.label})" for s in stages)
    pages = "\n".join(f"{i}. [{titles[p]}](@ref {theory_label(p)})" for i, p in enumerate(theory, 1))
    tried = "\n".join(f"- [{e.title}](@ref {e.label})" for e in experiments)
    text = re.sub(r"<!-- lessons -->.*?<!-- /lessons -->", lambda m: lessons, text, flags=re.S)
    text = re.sub(r"<!-- experiments -->.*?<!-- /experiments -->", lambda m: tried, text, flags=re.S)
    return re.sub(r"<!-- theory -->.*?<!-- /theory -->", lambda m: pages, text, flags=re.S)


def exercise_list(stages):
    """The stages with an exercise (exercises/NN_name/), for the lessons' page."""
    with_exercise = [s for s in stages if (s.path.parent.parent / "exercises" / s.folder).is_dir()]
    if not with_exercise:
        return ""
    items = "\n".join(f"- [{s.title}](@ref {s.label}): `exercises/{s.folder}/`, checked by "
                      f"`ctest --test-dir build -L exercise{s.number:02d}`" for s in with_exercise)
    return ("\n## Exercises with a test {#lessons_exercises}\n\n"
            "Each of these stages has an exercise: a copy of its kernel with the lines that carry its idea cut "
            "out, which the build runs through the stage's own tests, the runner (`flash-stages --exercise N`) "
            "and the benchmark. `exercises/README.md` says how to work on one; the stage is the solution.\n\n"
            + items + "\n")


def section_pages(out, stages, theory, titles):
    """Two parent pages, so that the lessons and the theory each form a branch of the site's tree."""
    (out / "lessons.md").write_text(
        "# Lessons {#lessons}\n\nOne page per stage, in course order. Each ends with the diff of its kernel "
        "against the previous stage's, generated from the sources when the site is built.\n\n" +
        "\n".join(f"- @subpage {s.label}" for s in stages) + "\n" + exercise_list(stages))
    (out / "theory.md").write_text(
        "# Theory {#theory}\n\nThe ideas behind the stages, with the derivations the lessons lean on.\n\n" +
        "\n".join(f"{i}. @subpage {theory_label(p)}" for i, p in enumerate(theory, 1)) + "\n")


def other_pages(out, top, experiments, ctx, tables, values):
    """The results page, the copy-a-stage recipe, the experiments page and its children."""
    for page in top + experiments:
        if page.label == "experiments":
            if page.src.exists():
                text = to_doxygen(fill_tables(page.src.read_text(), tables, page.src, values), page.src,
                                  page.label, ctx, toc=False)
            else:
                text = f"# {page.default_title} {{#{page.label}}}\n\n{EXPERIMENTS_INTRO}\n"
            text += "\n" + "\n".join(f"- @subpage {e.label}" for e in experiments) + "\n"
        else:
            text = to_doxygen(fill_tables(page.src.read_text(), tables, page.src, values), page.src,
                              page.label, ctx, toc=page.toc)
        (out / page.out).write_text(text)


def page_title(path):
    for line in path.read_text().splitlines():
        m = HEADING.match(line)
        if m and len(m[1]) == 1:
            return m[2]
    return path.stem


def lesson_page(root, stage, prev, nxt, ctx, tables, values=None, base=None):
    if stage.readme.exists():
        src = stage.readme
        text = fill_tables(src.read_text(), tables, src, values)
    else:
        src = stage.path / "README.md"  # where it will be; links resolve from the folder all the same
        kernels = ", ".join(f"`{k.relative_to(root).as_posix()}`" for k in stage.kernels) or "none yet"
        text = (f"# {stage.title}\n\n"
                f"The lesson of this stage is being written (`{stage.folder}/README.md`). Until then, the "
                f"comments at the top of its sources tell the story: {kernels}.\n")
    page = to_doxygen(text, src, stage.label, ctx, title=stage.title, toc=False)
    base = base or prev  # the stage the diff is against (DIFF_BASE), the one before unless named
    title = "The code: what changed" if base else "The code"
    intro = (f"The diff of this stage's kernel against [stage {base.number:02d}](@ref {base.label})'s, "
             f"generated from the sources when the site is built." if base else
             "The first stage's kernel in full, generated from the source when the site is built; every "
             "later lesson shows only what it changes.")
    nav = []
    if prev:
        nav.append(f"Previous: [{prev.title}](@ref {prev.label})")
    if nxt:
        nav.append(f"Next: [{nxt.title}](@ref {nxt.label})")
    page += (f"\n\n## {title} {{#{stage.label}_code}}\n\n{intro}\n\n"
             f"\\htmlinclude[block] {stage.label}_diff.html\n")
    if nav:
        page += "\n" + " · ".join(nav) + "\n"
    return page


def build_pages(root, out):
    root = root.resolve()
    stages = find_stages(root)
    theory = find_theory(root)
    headers = sorted((root / "harness").glob("*.h")) + sorted((root / "common").glob("*.cuh")) + \
        [h for s in stages for h in s.headers]
    top, experiments = find_other_pages(root)
    ctx = PageContext(root, stages, theory, headers, top + experiments)
    make_tables = load_make_tables(root)
    tables = make_tables.tables()
    values = make_tables.Values()
    runs = make_tables.load_bench()
    decode = make_tables.load_decode_bench() if make_tables.DECODE_BENCH.exists() else {}

    # Anchors first: a page may link to a heading of any other.
    sources = [(root / "docs/mainpage.md", "index")] + [(p, theory_label(p)) for p in theory] + \
              [(s.readme, s.label) for s in stages if s.readme.exists()] + \
              [(o.src, o.label) for o in top + experiments if o.src.exists()]
    for src, label in sources:
        ctx.anchors[label] = collect_anchors(src.read_text(), label)

    if out.exists():
        shutil.rmtree(out)
    for sub in ("theory", "lessons", "diffs", "pages", "experiments"):
        (out / sub).mkdir(parents=True)

    main_src = root / "docs/mainpage.md"
    titles = {p: page_title(p) for p in theory}
    text = to_doxygen(fill_tables(main_src.read_text(), tables, main_src, values), main_src, "index", ctx)
    (out / "mainpage.md").write_text(page_lists(course_map(text, stages, runs, decode), stages, theory, titles,
                                                experiments))
    section_pages(out, stages, theory, titles)
    other_pages(out, top, experiments, ctx, tables, values)

    for p in theory:
        text = fill_tables(p.read_text(), tables, p, values)
        (out / "theory" / f"{theory_label(p)}.md").write_text(to_doxygen(text, p, theory_label(p), ctx, toc=True))

    by_number = {s.number: s for s in stages}
    for i, s in enumerate(stages):
        prev = stages[i - 1] if i > 0 else None
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        base = by_number.get(DIFF_BASE.get(s.number), prev)
        (out / "lessons" / f"{s.label}.md").write_text(lesson_page(root, s, prev, nxt, ctx, tables, values, base))
        (out / "diffs" / f"{s.label}_diff.html").write_text(diff_html(root, s, base))
    print(f"site pages: main, {len(theory)} theory, {len(stages)} lessons "
          f"({sum(s.readme.exists() for s in stages)} written), {', '.join(o.label for o in top) or 'no other pages'}, "
          f"{len(experiments)} experiments -> {out}")


# ---------------------------------------------------------------------------------------------
# MathJax: the parts of Debian's MathJax 2 that the site's configuration loads
# ---------------------------------------------------------------------------------------------

MATHJAX_PARTS = ["MathJax.js", "extensions", "jax/input/TeX", "jax/element", "jax/output/SVG/jax.js",
                 "jax/output/SVG/config.js", "jax/output/SVG/autoload", "jax/output/SVG/fonts/TeX",
                 "localization/en"]


def copy_mathjax(src, dest):
    if not (src / "MathJax.js").exists():
        raise SystemExit(f"MathJax not found at {src}: install it (Debian/Ubuntu: apt-get install libjs-mathjax)")
    if dest.exists():
        shutil.rmtree(dest)
    for part in MATHJAX_PARTS:
        s, d = src / part, dest / part
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, symlinks=False)  # follow Debian's links: the copy stands alone
        else:
            shutil.copyfile(s, d)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pages")
    p.add_argument("--root", type=pathlib.Path, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--stamp", type=pathlib.Path)
    m = sub.add_parser("mathjax")
    m.add_argument("--src", type=pathlib.Path, required=True)
    m.add_argument("--dest", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if args.cmd == "pages":
        build_pages(args.root, args.out)
        if args.stamp:
            args.stamp.write_text("")
    else:
        copy_mathjax(args.src, args.dest)


if __name__ == "__main__":
    sys.exit(main())
