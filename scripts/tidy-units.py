#!/usr/bin/env python3
"""Picks the compiled files scripts/tidy runs clang-tidy on.

usage: tidy-units.py <compile_commands.json> (--all | <changed file>...)

Prints one path a line (relative to the source tree): with --all, every
file the build compiles; otherwise each changed .cc file the build
compiles, and for each changed header the first compiled file that
includes it (one in the header's own room first). A changed file that
nothing compiled covers is named on stderr.
"""
import json
import os
import re
import sys


def main():
    root = os.getcwd()
    compiled = []
    for entry in json.load(open(sys.argv[1])):
        path = os.path.relpath(
            os.path.join(entry["directory"], entry["file"]), root)
        if not path.startswith("..") and path not in compiled:
            compiled.append(path)
    wanted = sys.argv[2:]
    if wanted == ["--all"]:
        print("\n".join(compiled))
        return
    picked = []
    for changed in wanted:
        unit = changed if changed in compiled else None
        if unit is None and changed.endswith(".h"):
            # `#include "<a suffix of its path>"`: "setpoint/base/check.h",
            # "registry/redis/redis_client.h", "status.h" from its room.
            parts = changed.split("/")
            spellings = ["/".join(parts[i:]) for i in range(len(parts))]
            include = re.compile(r'^\s*#\s*include\s*"(' +
                                 "|".join(map(re.escape, spellings)) + ')"',
                                 re.MULTILINE)
            room = os.path.dirname(changed).replace("include/setpoint/",
                                                    "src/")
            for candidate in sorted(compiled,
                                    key=lambda c: not c.startswith(room)):
                try:
                    with open(candidate) as f:
                        text = f.read()
                except OSError:
                    continue
                if include.search(text):
                    unit = candidate
                    break
        if unit is None:
            print(f"tidy: {changed} is not compiled by the release build, "
                  "skipped", file=sys.stderr)
        elif unit not in picked:
            picked.append(unit)
    if picked:
        print("\n".join(picked))


if __name__ == "__main__":
    main()
