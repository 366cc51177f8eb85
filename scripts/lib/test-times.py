#!/usr/bin/env python3
"""Where a test run's time went, from cargo-nextest's JUnit report (scripts/test.sh prints it).

    scripts/lib/test-times.py JUNIT [SLOW_SECONDS]

Prints two Markdown tables: one row per test binary (its tests, the seconds its tests took
together, and its span: from its first test's start to its last test's end, which overlaps other
binaries' spans because nextest runs tests of every binary side by side), and every test that took
longer than SLOW_SECONDS (default 30), slowest first.
"""

import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta


def duration(seconds):
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    slow = float(sys.argv[2]) if len(sys.argv) == 3 else 30.0
    root = ET.parse(sys.argv[1]).getroot()

    binaries = []
    slow_tests = []
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        if not cases:
            continue
        total = 0.0
        starts, ends = [], []
        failed = 0
        for case in cases:
            seconds = float(case.get("time", "0"))
            total += seconds
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            stamp = case.get("timestamp")
            if stamp:
                start = datetime.fromisoformat(stamp)
                starts.append(start)
                ends.append(start + timedelta(seconds=seconds))
            if seconds > slow:
                slow_tests.append((seconds, suite.get("name"), case.get("name")))
        span = (max(ends) - min(starts)).total_seconds() if starts else total
        binaries.append((suite.get("name"), len(cases), failed, total, span))

    print()
    print("| test binary | tests | failed | time of its tests | span |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, count, failed, total, span in sorted(binaries, key=lambda b: -b[3]):
        print(f"| {name} | {count} | {failed} | {duration(total)} | {duration(span)} |")
    all_total = sum(b[3] for b in binaries)
    print(f"| **all {len(binaries)}** | {sum(b[1] for b in binaries)} | "
          f"{sum(b[2] for b in binaries)} | {duration(all_total)} | |")

    print()
    print(f"| test over {slow:g} s | binary | time |")
    print("| --- | --- | ---: |")
    for seconds, binary, name in sorted(slow_tests, reverse=True):
        print(f"| {name} | {binary} | {duration(seconds)} |")


if __name__ == "__main__":
    main()
