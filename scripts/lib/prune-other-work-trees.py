#!/usr/bin/env python3
"""Keeps a cargo target folder shared between clones from filling the disk.

    scripts/lib/prune-other-work-trees.py WORK_TREE TARGET_DIR...

The target folders outside the work tree (scripts/test.sh, scripts/images.sh, scripts/fuzz.sh)
keep the compiled dependencies for the next clone. The work tree's own crates are compiled again
in every clone, because cargo names their outputs after where their sources are, so each clone
would add its own copy of every test binary (a few GB) and nothing would ever remove the last
one's. Each TARGET_DIR remembers the work tree that last built in it (.work-tree); when WORK_TREE
is another one, the outputs built from work-tree sources go. Cargo writes a dep-info file beside
every output (deps/NAME-HASH.d, build/PKG-HASH/NAME-HASH.d) naming its sources: a dependency's
are under cargo's home, a work tree's crates' are relative to it (or, for the fuzz crate's path
dependencies, absolute paths into it).
"""

import os
import sys
from pathlib import Path


def outputs_and_sources(dep_info):
    """The outputs and the sources a make-style dep-info file names."""
    text = dep_info.read_text(errors="replace").replace("\\\n", " ")
    outputs, sources = set(), set()
    for line in text.splitlines():
        if line.startswith("#") or ": " not in line:
            continue
        head, _, tail = line.partition(": ")
        outputs.add(head.strip())
        sources.update(tail.split())
    return outputs, sources


def built_from_a_work_tree(sources, shared):
    """Whether any source is neither a dependency's nor generated in the target folder."""
    return any(
        not source.startswith("/")
        or not (source.startswith("/rustc/") or any(Path(source).is_relative_to(s) for s in shared))
        for source in sources
    )


def prune(target, work_tree, cargo_home):
    marker = target / ".work-tree"
    if marker.is_file() and marker.read_text().strip() == str(work_tree):
        return
    removed = freed = 0
    for dep_info in target.rglob("*.d"):
        # deps/ and examples/ hold every compilation's outputs, build/PKG-HASH/ the build
        # scripts'; the profile's own folder only links to the newest, which builds replace.
        if not (dep_info.parent.name in ("deps", "examples")
                or dep_info.parent.parent.name == "build"):
            continue
        outputs, sources = outputs_and_sources(dep_info)
        if not built_from_a_work_tree(sources, (cargo_home, target)):
            continue
        for output in outputs | {str(dep_info)}:
            path = Path(output)
            if path.is_file() and path.resolve().is_relative_to(target):
                freed += path.stat().st_size
                path.unlink()
                removed += 1
    marker.write_text(f"{work_tree}\n")
    if removed:
        print(f"prune-other-work-trees: {target}: removed {removed} files another work tree "
              f"built ({freed / 2**30:.1f} GiB)", file=sys.stderr)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    work_tree = Path(sys.argv[1]).resolve()
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")).resolve()
    for target in map(Path, sys.argv[2:]):
        if target.is_dir():
            prune(target.resolve(), work_tree, cargo_home)


if __name__ == "__main__":
    main()
