"""Every page of every lesson as a slide, in a real browser: the whole walk of
tests/ui/test_slides_browser.py. The suite walks four lessons of the fifteen; this walks them
all (239 s on two workers of a quiet 2-core machine, about three times that beside a busy
neighbour). Run it after a change to a lesson's text or to the picture's layout, and commit
its result.

    python bench/slides_walk.py [--out bench/results/slides_walk.json] [--workers 2]

Writes each lesson's outcome (passed, seconds, what was wrong) and the machine; exits 1 when a
page is not a slide.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_FILE = "tests/ui/test_slides_browser.py"


def lessons_of(junit_xml: str) -> dict[str, dict]:
    """Each walked lesson's outcome, from pytest's JUnit XML: passed, seconds, and the test's
    failure text (its list of problems) where it failed."""
    out: dict[str, dict] = {}
    for case in ET.fromstring(junit_xml).iter("testcase"):
        name = case.get("name", "")
        lesson = name[name.index("[") + 1:-1] if "[" in name else name
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped") is not None
        out[lesson] = {"passed": bad is None and not skipped, "skipped": skipped,
                       "seconds": round(float(case.get("time", 0)), 1),
                       "problems": (bad.get("message", "") if bad is not None else "")[:4000]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "slides_walk.json"))
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "walk.xml")
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", TEST_FILE, "-q", "-p", "no:cacheprovider",
                               "-n", str(args.workers), f"--junitxml={junit}"], cwd=ROOT,
                              env=dict(os.environ, PAGEDLAB_SLIDE_LESSONS="all"))
        seconds = time.perf_counter() - start
        with open(junit, encoding="utf-8") as f:
            lessons = lessons_of(f.read())
    result = {"machine": {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
                          "load_average_after": [round(x, 2) for x in os.getloadavg()]},
              "workers": args.workers, "seconds": round(seconds, 1),
              "lessons_passed": sum(v["passed"] for v in lessons.values()),
              "lessons": lessons, "pytest_rc": done.returncode}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "lessons"}))
    return 0 if done.returncode == 0 and lessons and all(v["passed"] for v in lessons.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
