"""The suite's checks in full where the suite runs a share of them (its 25 minutes on two cores):

- slides: every page of every lesson as a slide, in a real browser (tests/ui/test_slides_browser.py;
  the suite walks two lessons of the fifteen). 239 s on two workers of a quiet 2-core machine,
  about three times that beside a busy neighbour. Run it after a change to a lesson's text or to
  the picture's layout.
- lesson-inputs: every value of every input a lesson offers plays the lesson to its end
  (tests/lessons/test_lesson_inputs.py; the suite leaves out the real-model lessons whose plays
  take longest). Run it after a change to a lesson or to what its inputs drive.

    python bench/walks.py {slides,lesson-inputs,all} [--workers 2]

Each walk writes its cases' outcomes (passed, seconds, what was wrong) and the machine to
bench/results/<walk>_walk.json, and commits nothing itself; exits 1 when a case failed.
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
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Walk:
    test_file: str
    every_case: dict[str, str]  # the environment that makes the test file run every case
    result: str  # under bench/results


WALKS = {
    "slides": Walk("tests/ui/test_slides_browser.py", {"PAGEDLAB_SLIDE_LESSONS": "all"},
                   "slides_walk.json"),
    "lesson-inputs": Walk("tests/lessons/test_lesson_inputs.py", {"PAGEDLAB_LESSON_INPUTS": "all"},
                          "lesson_inputs_walk.json"),
}


def cases_of(junit_xml: str) -> dict[str, dict]:
    """Each case's outcome, by its parameter id (the test's name where it has none), from
    pytest's JUnit XML: passed, seconds, and the failure text where it failed."""
    out: dict[str, dict] = {}
    for case in ET.fromstring(junit_xml).iter("testcase"):
        name = case.get("name", "")
        key = name[name.index("[") + 1:-1] if "[" in name else name
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped") is not None
        out[key] = {"passed": bad is None and not skipped, "skipped": skipped,
                    "seconds": round(float(case.get("time", 0)), 1),
                    "problems": (bad.get("message", "") if bad is not None else "")[:4000]}
    return out


def run(walk: Walk, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "walk.xml")
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", walk.test_file, "-q",
                               "-p", "no:cacheprovider", "-n", str(workers), f"--junitxml={junit}"],
                              cwd=ROOT, env=dict(os.environ, **walk.every_case))
        seconds = time.perf_counter() - start
        with open(junit, encoding="utf-8") as f:
            cases = cases_of(f.read())
    return {"machine": {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
                        "load_average_after": [round(x, 2) for x in os.getloadavg()]},
            "test_file": walk.test_file, "workers": workers, "seconds": round(seconds, 1),
            "cases_passed": sum(v["passed"] for v in cases.values()), "cases": cases,
            "pytest_rc": done.returncode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("walk", choices=[*WALKS, "all"])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    ok = True
    for name in WALKS if args.walk == "all" else [args.walk]:
        result = run(WALKS[name], args.workers)
        with open(os.path.join(ROOT, "bench", "results", WALKS[name].result), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(name, json.dumps({k: v for k, v in result.items() if k != "cases"}))
        ok &= result["pytest_rc"] == 0 and bool(result["cases"]) and all(
            v["passed"] for v in result["cases"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
