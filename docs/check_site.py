#!/usr/bin/env python3
"""Checks the built site the way a reader meets it (run by CI after the docs target).

    check_site.py <build>/docs/html [--root <repo>] [--page NAME.html ...] [--chromium PATH]

1. Links: every .html file of the site is read, and every local href/src in it must point at a file
   of the site, and an #anchor at an id or name in that file. External links are not followed.
2. Pages: each stage folder stages/NN_* has its page lesson_NN.html with a generated diff; docs/results.md,
   docs/copy_a_stage.md and each docs/experiments/NAME.md have theirs (results.html, copy_a_stage.html,
   experiments_NAME.html, under experiments.html).
3. Browser: the site is served from a local HTTP server on 127.0.0.1 and headless Chromium loads the
   main page, the theory pages, the lessons and the pages of 2 (or the --page list). In the DOM it leaves, MathJax
   must have rendered every formula the page has, with no MathJax error (the main page, the theory
   pages and every lesson must have formulas: a lesson with none has its math written as plain text),
   and the visible text must hold no raw TeX delimiter: \\( \\) \\[ \\] $$ or Doxygen's \\f$ \\f[,
   and no literal ** (Markdown bold that Doxygen failed to render).
Exits 1 with one line per problem, 0 when all is well.
"""
import argparse
import functools
import html.parser
import http.server
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\\f\$|\\f\[|\\f\]")
RAW_BOLD = re.compile(r"\*\*")
SKIP_TEXT = {"script", "style", "code", "pre", "textarea"}


class Page(html.parser.HTMLParser):
    """Ids, links and visible text of one HTML document; MathJax's rendered output and errors."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.text = set(), [], []
        self.rendered = self.errors = 0
        self.error_messages = []
        self.stack = []  # open elements whose text is not prose
        self.in_error = False  # inside MathJax's red error box (SVG output: a red <g> holding a <text>)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(a[key])
        classes = (a.get("class") or "").split()
        if tag == "mjx-container" or "MathJax_SVG" in classes or "MathJax_CHTML" in classes or "MathJax" in classes:
            self.rendered += 1
        if tag == "merror" or "MathJax_Error" in classes or "merror" in classes:
            self.errors += 1
        if tag == "rect" and a.get("fill") == "rgb(255, 255, 136)":  # MathJax 2 SVG: a TeX error's box
            self.errors += 1
        if tag == "g" and a.get("fill") == "rgb(204, 0, 0)":
            self.in_error = True
        skip = tag in SKIP_TEXT or "fragment" in classes or "MathJax_Preview" in classes
        if tag not in ("br", "img", "hr", "input", "meta", "link"):
            self.stack.append(skip)

    def handle_endtag(self, tag):
        if tag == "svg":
            self.in_error = False
        if self.stack and tag not in ("br", "img", "hr", "input", "meta", "link"):
            self.stack.pop()

    def handle_data(self, data):
        if self.in_error and data.strip():
            self.error_messages.append(data.strip())
        if not any(self.stack):
            self.text.append(data)


def parse(text):
    page = Page()
    page.feed(text)
    page.close()
    return page


def check_links(site):
    broken, pages = {}, {}
    files = sorted(site.rglob("*.html"))
    for f in files:
        pages[f.resolve()] = parse(f.read_text(errors="replace"))
    checked = 0
    for f in files:
        for link in pages[f.resolve()].links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or link.startswith("//") or not (url.path or url.fragment):
                continue  # external, javascript:, mailto:, or a bare "#"
            target = (f.parent / urllib.parse.unquote(url.path)).resolve() if url.path else f.resolve()
            where = f.relative_to(site)
            checked += 1
            try:
                target.relative_to(site.resolve())
            except ValueError:
                broken.setdefault(f"link {link} leaves the site", []).append(where)
                continue
            if not target.exists():
                broken.setdefault(f"broken link {link}: no file {target.relative_to(site.resolve())}", []).append(where)
            elif url.fragment and target.suffix == ".html" and url.fragment not in pages[target].ids:
                broken.setdefault(f"broken anchor {link}: no id {url.fragment!r} in {target.name}", []).append(where)
    problems = []
    for what, where in sorted(broken.items()):
        sources = sorted({str(w) for w in where})
        shown = ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
        problems.append(f"{what} (in {shown})")
    return problems, len(files), checked, sum(len(w) for w in broken.values())


def check_other_pages(site, root):
    """The pages made from docs/ beside the theory: results, copying a stage, the experiments."""
    problems = []
    docs = root / "docs"
    wanted = [(docs / "results.md", "results.html"), (docs / "copy_a_stage.md", "copy_a_stage.html")]
    experiments = sorted(p for p in (docs / "experiments").glob("*.md") if p.name != "README.md")
    wanted += [(p, "experiments_" + re.sub(r"[^A-Za-z0-9_]", "_", p.stem) + ".html") for p in experiments]
    if experiments:
        wanted.append((docs / "experiments", "experiments.html"))
    for src, page in wanted:
        if src.exists() and not (site / page).exists():
            problems.append(f"{src.relative_to(root)}: no page {page}")
    return problems


def check_lessons(site, root):
    problems = []
    for folder in sorted((root / "stages").iterdir()):
        m = re.match(r"^(\d\d)_\w+$", folder.name)
        if not (folder.is_dir() and m):
            continue
        page = site / f"lesson_{m[1]}.html"
        if not page.exists():
            problems.append(f"stage {folder.name}: no lesson page {page.name}")
        elif 'class="stage-diff"' not in page.read_text():
            problems.append(f"stage {folder.name}: {page.name} has no generated diff")
    return problems


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def find_chromium(given):
    for name in ([given] if given else []) + ["chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("check_site: no Chromium found (Debian/Ubuntu: apt-get install chromium)")


def dump_dom(chromium, url, profile):
    cmd = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}",
           "--virtual-time-budget=10000", "--dump-dom", url]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if result.returncode != 0 or "<html" not in result.stdout.lower():
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"chromium exited {result.returncode} on {url}: {tail}")
    return result.stdout


def check_in_browser(site, names, must_have_math, chromium):
    problems = []
    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        with tempfile.TemporaryDirectory() as profile:
            for name in names:
                static = (site / name).read_text()
                expected = len(re.findall(r"\\\(|\\\[", re.sub(r"<script.*?</script>", "", static, flags=re.S)))
                start = time.time()
                try:
                    dom = parse(dump_dom(chromium, f"http://127.0.0.1:{port}/{name}", profile))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    problems.append(f"{name}: {e}")
                    continue
                raw = sorted(set(RAW_TEX.findall("".join(dom.text))))
                bold = len(RAW_BOLD.findall("".join(dom.text)))
                print(f"  {name}: {expected} formulas, {dom.rendered} rendered by MathJax, "
                      f"{dom.errors} errors, {len(raw)} raw delimiters ({time.time() - start:.1f} s)")
                if expected == 0 and name in must_have_math:
                    problems.append(f"{name}: the page has no formula, so MathJax cannot be checked on it")
                if dom.rendered < expected or (name in must_have_math and dom.rendered == 0):
                    problems.append(f"{name}: MathJax rendered {dom.rendered} of {expected} formulas")
                if dom.errors:
                    problems.append(f"{name}: MathJax reported {dom.errors} TeX errors: "
                                    f"{'; '.join(dom.error_messages) or 'see the page'}")
                if raw:
                    problems.append(f"{name}: raw TeX left in the text: {' '.join(raw)}")
                if bold:
                    problems.append(f"{name}: {bold} literal '**' in the text (bold Markdown left unrendered)")
    finally:
        server.shutdown()
        server.server_close()
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("site", type=pathlib.Path, help="the HTML folder (<build>/docs/html)")
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent)
    parser.add_argument("--page", action="append", help="a page to load in the browser (default: main + theory)")
    parser.add_argument("--chromium", help="the browser to run (default: chromium on PATH)")
    args = parser.parse_args()
    site = args.site.resolve()
    if not (site / "index.html").exists():
        raise SystemExit(f"check_site: no {site}/index.html: build the docs target first")
    theory = sorted(p.name for p in site.glob("theory_*.html"))
    if not theory:
        raise SystemExit("check_site: the site has no theory page")
    lessons = sorted(p.name for p in site.glob("lesson_*.html"))
    others = [p for p in ["results.html", "copy_a_stage.html", "experiments.html"] if (site / p).exists()] + \
        sorted(p.name for p in site.glob("experiments_*.html"))
    must_have_math = {"index.html", *theory, *lessons}  # every page of the course shows formulas
    names = args.page or ["index.html"] + theory + lessons + others

    problems, n_files, n_links, n_broken = check_links(site)
    print(f"links: {n_links} local links in {n_files} HTML files, {n_broken} broken")
    lesson_problems = check_lessons(site, args.root)
    print(f"lessons: {len(lesson_problems)} problems")
    problems += lesson_problems
    page_problems = check_other_pages(site, args.root)
    print(f"results, experiments and copy-a-stage pages: {len(page_problems)} problems")
    problems += page_problems
    print(f"browser: {len(names)} pages in headless Chromium")
    problems += check_in_browser(site, names, must_have_math, find_chromium(args.chromium))

    for p in problems:
        print(f"FAIL {p}")
    print(f"check_site: {'FAILED, ' + str(len(problems)) + ' problems' if problems else 'all checks passed'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
