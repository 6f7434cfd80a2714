#!/usr/bin/env python3
"""Doxygen input filter for the project's headers (FILTER_PATTERNS in Doxyfile.in).

The headers are documented with plain // comments, written to be read in the source. This filter
lets the same comments be the API reference, without a second comment style:
  - the comment block that opens a file documents the file (\\file);
  - a comment block directly above a declaration, at namespace or class scope, documents it;
  - a comment after a member, enumerator or parameter on the same line documents that entity (///<).
Comments inside function bodies, section banners (followed by a blank line) and comments above
preprocessor lines stay plain comments; a preprocessor line continued with backslashes is skipped
whole (a macro's body is no declaration). Line numbers are kept, so warnings point at the header.

A public symbol with no comment at all stays undocumented, and Doxygen warns (an error in CI).
Usage:
    doxygen_filter.py FILE    prints FILE filtered (what Doxygen calls)
"""
import pathlib
import re
import sys

AGGREGATE = re.compile(r"\b(namespace|struct|class|union|enum|extern)\b")
ACCESS = re.compile(r"^(public|private|protected)\s*:$")


def split_line(line, in_block):
    """(code without strings and comments, column of a trailing // comment or -1, in_block after)."""
    code, i, n = [], 0, len(line)
    while i < n:
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(code), -1, True
            i, in_block = end + 2, False
            continue
        c = line[i]
        if line.startswith("//", i):
            return "".join(code), i, False
        if line.startswith("/*", i):
            in_block, i = True, i + 2
            continue
        if c in "\"'":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            code.append(c + c)
            i = j + 1
            continue
        code.append(c)
        i += 1
    return "".join(code), -1, in_block


def multiple_declarators(code):
    """True for `T a, b;`: a comma outside any brackets, in a declaration that is no function."""
    code = code.strip()
    if not code.endswith(";") or "(" in code:
        return False
    depth = 0
    for c in code:
        depth += c in "<[{"
        depth -= c in ">]}"
        if c == "," and depth == 0:
            return True
    return False


def doc_block(texts, suffix=""):
    """The lines of a /** */ block in place of as many // lines (same line count)."""
    # The brief ends at the first ". "; an abbreviation's period must not end it.
    texts = [re.sub(r"\b(e\.g|i\.e|etc|vs)\. ", r"\1.\\ ", t) for t in texts]
    if len(texts) == 1:
        return [f"/** {texts[0]}{suffix} */"]
    out = [f"/** {texts[0]}"]
    out += [f"    {t}" for t in texts[1:-1]]
    out.append(f"    {texts[-1]}{suffix} */")
    return out


def filter_header(path):
    lines = path.read_text().splitlines()
    out = list(lines)

    # The file's opening comment documents the file.
    top = 0
    while top < len(lines) and lines[top].lstrip().startswith("//"):
        top += 1
    if top:
        texts = [re.sub(r"^\s*//\s?", "", l) for l in lines[:top]]
        out[:top] = doc_block(texts, " \\file")  # \file last: it takes no name then

    stack = []          # one entry per open brace: "agg" or "body"
    stmt = ""           # code of the statement begun so far
    pending = []        # indices of the // lines just above, at aggregate scope
    in_block = False
    in_directive = False  # inside a preprocessor line continued with backslashes
    for idx in range(top, len(lines)):
        line = lines[idx]
        stripped = line.strip()
        in_body = "body" in stack
        if in_directive or (not in_block and stripped.startswith("#")):
            in_directive = line.rstrip().endswith("\\")
            pending = []
            continue
        if not in_block and stripped.startswith("//"):
            pending = pending + [idx] if not in_body else []
            continue
        if not stripped:
            pending = []
            continue
        code, comment_col, in_block = split_line(line, in_block)
        starts_statement = not in_body and stmt.strip() == ""
        depth_before = len(stack)

        indent = re.match(r"\s*", line)[0]
        text = line[len(indent):comment_col] if comment_col >= 0 else line[len(indent):]
        lead = ""

        # A comment block directly above a declaration documents it.
        if starts_statement and pending:
            texts = [re.sub(r"^\s*//\s?", "", lines[i]) for i in pending]
            block_indent = re.match(r"\s*", lines[pending[0]])[0]
            for i, doc in zip(pending, doc_block(texts)):
                out[i] = block_indent + doc
        pending = []

        # Track scopes: an aggregate's braces hold declarations, a function's hold code.
        for c in code:
            if c == "{":
                kind = "body" if "body" in stack or not AGGREGATE.search(stmt) else "agg"
                stack.append(kind)
                stmt = ""
            elif c == "}":
                if stack:
                    stack.pop()
                stmt = ""
            elif c == ";":
                stmt = ""
            else:
                stmt += c
        stmt += " "
        if ACCESS.match(code.strip()):
            stmt = ""

        head = code.strip()
        member_line = (not in_body and len(stack) == depth_before and "body" not in stack and head
                       and head not in ("}", "};") and not head.endswith("{") and not ACCESS.match(head))
        # `T a, b, c;` declares three members; a member group hands the one comment to each.
        multi = bool(member_line and starts_statement and multiple_declarators(code))
        trailing = ""
        if comment_col >= 0:
            comment = line[comment_col + 2:].strip()
            if member_line and multi:
                lead += f"/** {comment} */ "  # a comment after a member documents it
            elif member_line:
                trailing = f"/**< {comment} */"
            else:
                trailing = line[comment_col:]
        if multi:
            out[idx] = f"{indent}{lead}/**@{{*/ {text.rstrip()} /**@}}*/" + (f"  {trailing}" if trailing else "")
        elif lead or comment_col >= 0:
            out[idx] = indent + lead + text + trailing
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(filter_header(pathlib.Path(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
