#!/usr/bin/env python3
"""Keeps exercises/ in step with stages/: an exercise is its stage's source with the lines
that carry the stage's idea cut out, and nothing else changed.

    exercises.py [check]     the CI check (ctest: cpu_exercises_match_stages)
    exercises.py refresh     after a stage changed: carry its changes into its exercise
    exercises.py solution N  print exercise N's solution: the stage's lines for each TODO block

Each exercises/NN_name/FILE has a stage twin stages/NN_name/FILE. In the exercise, every cut is a
block of lines from a `// TODO(exercise): ...` line to a `// END TODO(exercise)` line: the hint, and
where needed a placeholder that keeps the file compiling (and running, to a wrong result). A block
names its lesson section: `Lesson: stages/NN_name/README.md, "Section title"`.

`check` compares each exercise with its stage line by line and fails unless
  - every line that differs lies inside a TODO block, and every block differs from the stage:
    so putting the stage's lines back in place of each block (the solution, as `solution N` prints
    it) gives the stage byte for byte, and the exercise's tests pass exactly when the stage's do;
  - each block points at a lesson section that exists (a heading of that README);
  - stages 01-07 each have an exercise folder with at least one block.
It writes nothing. Exit 0 when all is well, 1 with one line per problem.

`refresh` rewrites each exercise from its stage, keeping the exercise's TODO blocks: the stage's
changes outside the cut lines come in. A change of the stage that touches the cut lines cannot be
carried and is reported; edit that block by hand. Review the result with `git diff exercises/`.
"""
import difflib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TODO = re.compile(r"^\s*// TODO\(exercise\):")
END = re.compile(r"^\s*// END TODO\(exercise\)\s*$")
LESSON = re.compile(r'Lesson: (stages/[\w.-]+/README\.md), ("[^"]+"(?:(?:,| and) "[^"]+")*)')
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")
# The stages that have an exercise: the fp32 course, 01-07.
EXERCISE_STAGES = range(1, 8)


def blocks_of(lines, where, problems):
    """[(first, last)] line indices of the TODO blocks, END line included."""
    blocks, start = [], None
    for i, line in enumerate(lines):
        if TODO.match(line):
            if start is not None:
                problems.append(f"{where}:{i + 1}: TODO(exercise) inside the block opened at line {start + 1}")
            start = i
        elif END.match(line):
            if start is None:
                problems.append(f"{where}:{i + 1}: END TODO(exercise) without its TODO(exercise)")
            else:
                blocks.append((start, i))
                start = None
    if start is not None:
        problems.append(f"{where}:{start + 1}: TODO(exercise) without an END TODO(exercise) line")
    return blocks


def block_at(blocks, i1, i2):
    """The block that holds exercise lines [i1, i2) (for an insertion, i1 == i2: the block the stage's
    lines go into), or None."""
    for b in blocks:
        first, last = b
        if i1 == i2 and first <= i1 <= last + 1:
            return b
        if i1 != i2 and first <= i1 and i2 <= last + 1:
            return b
    return None


def pairs():
    """(exercise file, stage file) for every file under exercises/NN_name/."""
    found = []
    for folder in sorted((ROOT / "exercises").iterdir()):
        if not folder.is_dir() or not re.match(r"^\d\d_", folder.name):
            continue
        for ex in sorted(folder.iterdir()):
            if ex.suffix in (".cu", ".cuh", ".h", ".cpp"):
                found.append((ex, ROOT / "stages" / folder.name / ex.name))
    return found


def rel(p):
    return p.relative_to(ROOT).as_posix()


def headings(readme):
    return {m[1] for line in readme.read_text().splitlines() if (m := HEADING.match(line))}


def compare(ex, stage):
    """The exercise's lines, its blocks, the diff opcodes and the problems found."""
    problems = []
    ex_lines = ex.read_text().splitlines(keepends=True)
    st_lines = stage.read_text().splitlines(keepends=True)
    blocks = blocks_of(ex_lines, rel(ex), problems)
    ops = difflib.SequenceMatcher(None, ex_lines, st_lines, autojunk=False).get_opcodes()
    touched = set()
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        b = block_at(blocks, i1, i2)
        if b is None:
            problems.append(f"{rel(ex)}:{i1 + 1}: differs from {rel(stage)}:{j1 + 1} outside any TODO(exercise) "
                            f"block ({tag} of {max(i2 - i1, j2 - j1)} lines): the stage changed? "
                            f"scripts/checks/exercises.py refresh carries its changes in")
        else:
            touched.add(b)
    for b in blocks:
        if b not in touched:
            problems.append(f"{rel(ex)}:{b[0] + 1}: this TODO(exercise) block cuts nothing from {rel(stage)}")
        text = "".join(ex_lines[b[0]:b[1] + 1])
        lessons = LESSON.findall(text)
        if not lessons:
            problems.append(f"{rel(ex)}:{b[0] + 1}: the block names no lesson section "
                            f'(Lesson: stages/NN_name/README.md, "Section")')
        for readme, sections in lessons:
            path = ROOT / readme
            if not path.exists():
                problems.append(f"{rel(ex)}:{b[0] + 1}: {readme} does not exist")
                continue
            for section in re.findall(r'"([^"]+)"', sections):
                if section not in headings(path):
                    problems.append(f'{rel(ex)}:{b[0] + 1}: {readme} has no section "{section}"')
    return ex_lines, st_lines, blocks, ops, problems


def solved(ex_lines, st_lines, ops):
    """The exercise with the stage's lines put back in place of every differing part."""
    out = []
    for tag, i1, i2, j1, j2 in ops:
        out += ex_lines[i1:i2] if tag == "equal" else st_lines[j1:j2]
    return out


def check():
    problems, summary = [], []
    by_stage = {}
    for ex, stage in pairs():
        if not stage.exists():
            problems.append(f"{rel(ex)}: no stage file {rel(stage)} to be the exercise of")
            continue
        ex_lines, st_lines, blocks, ops, found = compare(ex, stage)
        problems += found
        if not found and solved(ex_lines, st_lines, ops) != st_lines:
            problems.append(f"{rel(ex)}: with the stage's lines put back it is not {rel(stage)}")  # cannot happen
        number = int(ex.parent.name[:2])
        by_stage[number] = by_stage.get(number, 0) + len(blocks)
        cut = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag != "equal")
        summary.append(f"  {rel(ex)}: {len(blocks)} TODO block(s), {cut} line(s) of {rel(stage)} cut")
    for n in EXERCISE_STAGES:
        if not by_stage.get(n):
            problems.append(f"exercises/{n:02d}_*: stage {n:02d} has no exercise with a TODO(exercise) block")
    if problems:
        print("\n".join(problems))
        print(f"exercises.py check: {len(problems)} problem(s)")
        return 1
    print("\n".join(summary))
    print(f"exercises.py check: {len(summary)} exercise files are their stages with only the TODO(exercise) "
          f"blocks changed; the stages' lines put back give the stages byte for byte")
    return 0


def refresh():
    status = 0
    for ex, stage in pairs():
        if not stage.exists():
            continue
        ex_lines, st_lines, blocks, ops, _ = compare(ex, stage)
        out, carried = [], 0
        for tag, i1, i2, j1, j2 in ops:
            if tag == "equal":
                out += ex_lines[i1:i2]
            elif block_at(blocks, i1, i2):
                out += ex_lines[i1:i2]  # the cut: keep the exercise's block
            elif any(first <= i2 - 1 and i1 <= last for first, last in blocks):
                print(f"{rel(ex)}:{i1 + 1}: the stage changed across a TODO(exercise) block; edit it by hand")
                out += ex_lines[i1:i2]
                status = 1
            else:
                out += st_lines[j1:j2]  # the stage's change, carried in
                carried += 1
        if carried:
            ex.write_text("".join(out))
            print(f"{rel(ex)}: {carried} change(s) of {rel(stage)} carried in")
    print("exercises.py refresh: done; review with git diff exercises/, then run exercises.py check")
    return status


def solution(number):
    for ex, stage in pairs():
        if int(ex.parent.name[:2]) != number or not stage.exists():
            continue
        ex_lines, st_lines, blocks, ops, _ = compare(ex, stage)
        for tag, i1, i2, j1, j2 in ops:
            if tag != "equal":
                print(f"--- {rel(ex)} lines {i1 + 1}-{max(i1, i2)}: replace with {rel(stage)} lines {j1 + 1}-{j2}:")
                print("".join(st_lines[j1:j2]), end="")
    return 0


def main(argv):
    command = argv[1] if len(argv) > 1 else "check"
    if command == "check":
        return check()
    if command == "refresh":
        return refresh()
    if command == "solution" and len(argv) == 3 and argv[2].isdigit():
        return solution(int(argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
