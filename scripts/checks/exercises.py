#!/usr/bin/env python3
"""Keeps exercises/ in step with stages/: an exercise is its stage's source with the lines
that carry the stage's idea cut out, and nothing else changed.

    exercises.py [check]     the CI check (ctest: cpu_exercises_match_stages)
    exercises.py refresh     after a stage changed: carry its changes into its exercise
    exercises.py solution N  print exercise N's solution: the stage's lines for each TODO block
    exercises.py solve N --as-readme-says
                             do what exercises/README.md tells the learner, in place: replace each
                             block, its TODO(exercise) and END TODO(exercise) lines included, with the
                             stage's lines (CI runs the exercise's tests on the result, then restores it)
    exercises.py extract N SOURCE OUT
                             write the lines of exercise N's idea, as SOURCE holds them (the exercise
                             file, solved or not, or the stage's), to OUT for its CPU test

Each exercises/NN_name/FILE has a stage twin stages/NN_name/FILE. In the exercise, every cut is a
block of lines from a `// TODO(exercise): ...` line to a `// END TODO(exercise)` line: the hint, and
where needed a placeholder that keeps the file compiling (and running, to a wrong result). A block
names its lesson section: `Lesson: stages/NN_name/README.md, "Section title"`.

`check` compares each exercise file with its stage line by line. A file is
  - unsolved when every line that differs lies inside a TODO block and every block differs from the
    stage: so putting the stage's lines back in place of each block (the solution, as `solution N`
    prints it) gives the stage byte for byte, and the exercise's tests pass exactly when the stage's
    do. Each block must point at a lesson section that exists (a heading of that README);
  - solved when it is its stage byte for byte (the blocks replaced by the stage's lines, markers
    gone, as exercises/README.md says); a file that holds no idea of the stage is always this;
  - drift otherwise, a problem: the stage changed (`refresh`), or a solution differs from the stage.
And every stage, 01-14, has an exercise folder with at least one file that has or had a block.
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
# The stages that have an exercise: all of them.
EXERCISE_STAGES = range(1, 15)

# The lines of each idea that has a CPU test (tests/test_exercise_ideas.cpp): in the named file, the
# lines strictly between the first line that contains `start` (after the first that contains `after`,
# where given) and the next line that contains `end` (with start_exact or end_exact: that is the
# whole line, trailing spaces aside). The bounds lie outside the TODO blocks, so the same lines are
# found in the exercise as shipped, as the learner solved it, and in the stage.
IDEAS = {
    8: {"file": "tensor_cores.cu", "start": "const int lane = threadIdx.x % 32;",
        "end": "const int warp_row = warp * kWarpRows;"},
    9: {"file": "swizzle_pipeline.cu", "start": "__device__ int swizzled(int row, int col) {", "end": "}",
        "end_exact": True},
    12: {"file": "mainloop.cuh", "after": "mn_major_descriptor<L::kKVPanelBytes>(v_panel0, ks)", "start": "}",
         "end": "// The producer: one thread issues every copy"},
    13: {"file": "decoding_kernel.cuh", "after": "merge_kernel(", "start": "tensor_core::grid_dependency_wait();",
         "end": "const float inv = flash::softmax_normalizer(stats);"},
    # ds_byte_offset, whole: from the closing brace of the function before it to the comment of the one
    # after it.
    14: {"file": "mainloop.cuh", "after": "inline void to_a_fragments(", "start": "}", "start_exact": True,
         "end": "// dS^T into shared memory for dQ"},
}


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
        number = int(ex.parent.name[:2])
        by_stage.setdefault(number, 0)
        if ex.read_bytes() == stage.read_bytes():
            has_idea = number in IDEAS and IDEAS[number]["file"] == ex.name or registry_file(ex)
            by_stage[number] += 1 if has_idea else 0
            summary.append(f"  {rel(ex)}: " + ("solved: it is " if has_idea else "a copy of ") + rel(stage))
            continue
        ex_lines, st_lines, blocks, ops, found = compare(ex, stage)
        problems += found
        if not found and solved(ex_lines, st_lines, ops) != st_lines:
            problems.append(f"{rel(ex)}: with the stage's lines put back it is not {rel(stage)}")  # cannot happen
        by_stage[number] += len(blocks)
        cut = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag != "equal")
        summary.append(f"  {rel(ex)}: unsolved: {len(blocks)} TODO block(s), {cut} line(s) of {rel(stage)} cut")
    for n in EXERCISE_STAGES:
        if not by_stage.get(n):
            problems.append(f"exercises/{n:02d}_*: stage {n:02d} has no exercise file with, or solved from, "
                            f"a TODO(exercise) block")
    if problems:
        print("\n".join(problems))
        print(f"exercises.py check: {len(problems)} problem(s). A solution of your own that differs from the "
              f"stage is reported here too; the exercise's tests (ctest -L exerciseNN) judge it")
        return 1
    print("\n".join(summary))
    print(f"exercises.py check: {len(summary)} exercise files are their stages, solved, or their stages with only "
          f"the TODO(exercise) blocks changed; the stages' lines put back give the stages byte for byte")
    return 0


def registry_file(ex):
    """Whether harness/registry.cpp names this file as an exercise's file (the one with the blocks)."""
    return f'"{rel(ex)}"' in (ROOT / "harness" / "registry.cpp").read_text()


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


def solve(number):
    """What exercises/README.md tells the learner to do, done with the stage's lines: each block,
    from its TODO(exercise) line to its END TODO(exercise) line, replaced by the lines of the stage
    that stand where the block stands."""
    done = 0
    for ex, stage in pairs():
        if int(ex.parent.name[:2]) != number or not stage.exists():
            continue
        ex_lines, st_lines, blocks, ops, problems = compare(ex, stage)
        if problems:
            print("\n".join(problems))
            return 1
        # Where each exercise line outside the blocks is in the stage (those lines are all equal ones).
        at = {}
        for tag, i1, i2, j1, _ in ops:
            if tag == "equal":
                for i in range(i1, i2):
                    at[i] = j1 + i - i1
        out, i = [], 0
        for first, last in blocks:
            out += ex_lines[i:first]
            begin = at[first - 1] + 1 if first > 0 else 0
            end = at[last + 1] if last + 1 < len(ex_lines) else len(st_lines)
            out += st_lines[begin:end]
            i = last + 1
        out += ex_lines[i:]
        if blocks:
            ex.write_text("".join(out))
            done += len(blocks)
            print(f"{rel(ex)}: {len(blocks)} block(s) replaced by the stage's lines, markers removed")
    if not done:
        print(f"exercise {number:02d}: no TODO(exercise) block to solve")
        return 1
    return 0


def extract(number, source, out):
    """The idea's lines of exercise `number` from `source` (see IDEAS), written to `out`."""
    idea = IDEAS.get(number)
    if idea is None:
        print(f"exercise {number:02d} has no CPU test of its idea")
        return 2
    lines = pathlib.Path(source).read_text().splitlines(keepends=True)
    i = 0
    if "after" in idea:
        while i < len(lines) and idea["after"] not in lines[i]:
            i += 1
    starts = (lambda l: l.rstrip() == idea["start"]) if idea.get("start_exact") else (lambda l: idea["start"] in l)
    while i < len(lines) and not starts(lines[i]):
        i += 1
    first = i if idea.get("keep_start") else i + 1
    j = i + 1
    ends = (lambda l: l.rstrip() == idea["end"]) if idea.get("end_exact") else (lambda l: idea["end"] in l)
    while j < len(lines) and not ends(lines[j]):
        j += 1
    if j >= len(lines):
        print(f"{source}: the lines of exercise {number:02d}'s idea were not found "
              f"(between '{idea['start']}' and '{idea['end']}')")
        return 1
    text = f"// Lines {first + 1}-{j} of {source}, for tests/test_exercise_ideas.cpp.\n" + "".join(lines[first:j])
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return 0


def main(argv):
    command = argv[1] if len(argv) > 1 else "check"
    if command == "check":
        return check()
    if command == "refresh":
        return refresh()
    if command == "solution" and len(argv) == 3 and argv[2].isdigit():
        return solution(int(argv[2]))
    if command == "solve" and len(argv) == 4 and argv[2].isdigit() and argv[3] == "--as-readme-says":
        return solve(int(argv[2]))
    if command == "extract" and len(argv) == 5 and argv[2].isdigit():
        return extract(int(argv[2]), argv[3], argv[4])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
