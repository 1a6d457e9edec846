"""Summary of one peer suite from pytest's JUnit XML, by class of failure (scripts/peer-suites.sh).

    python summarize.py NAME REPORT.xml

Each failing test (errors count as failures) is put in exactly one class by the table in
scripts/peer/expected.py: protocol, unsupported feature (by feature), pair not served, model
wording. A failing test not in the table, or one whose failure lacks its entry's evidence, is a
protocol failure. Prints, per class, its count and its failures (for protocol failures, the
traceback's last lines and the test's HTTP exchanges as recorded by record_http.py), then the
listed tests that passed and the table entries that matched no test, and last the summary line:

    NAME: N passed, N failed, N skipped  (protocol N, unsupported feature N, ...)

Exit status 0 when there is no protocol failure, else 1 (a missing or unreadable report counts
as one protocol failure).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The table lives next to this file.
from expected import (
    CLASSES,
    EXPECTED,
    FEATURES,
    PROTOCOL,
    UNSUPPORTED,
    lookup,
)

MESSAGE_CHARS = 200
TRACEBACK_LINES = 14
HTTP_LINES = 16


@dataclass
class Failure:
    nodeid: str
    message: str  # first line of the failure's message
    text: str  # message and traceback
    traceback: str
    http: str  # the recorded HTTP exchanges, if any
    cls: str
    feature: str = ""
    note: str = ""


def nodeid_of(case: ET.Element) -> str:
    """pytest's node id from a JUnit testcase: classname 'tests.test_x[.Class]' + name."""
    parts = (case.get("classname") or "").split(".")
    # The module path ends at the last part that is not a class name (classes are capitalised).
    split = len(parts)
    while split > 1 and parts[split - 1][:1].isupper():
        split -= 1
    path = "/".join(parts[:split]) + ".py"
    return "::".join([path, *parts[split:], case.get("name") or ""])


def classify(suite: str, nodeid: str, text: str) -> tuple[str, str, str]:
    """(class, feature, note) of a failing test."""
    entry = lookup(suite, nodeid)
    if entry is None:
        return PROTOCOL, "", "not in scripts/peer/expected.py"
    missing = entry.missing_evidence(text)
    if missing:
        return PROTOCOL, "", (f"listed as {entry.cls} ({entry.reason}), but the failure does "
                              f"not show {' / '.join(repr(m) for m in missing)}")
    return entry.cls, entry.feature, ""


def main(argv: list[str]) -> int:
    name, path = argv[0], argv[1]
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"{name}: 0 passed, 1 failed, 0 skipped  (protocol 1: no report: {exc})")
        return 1
    passed = skipped = 0
    failures: list[Failure] = []
    passed_but_listed: list[str] = []
    seen: list[str] = []
    for case in root.iter("testcase"):
        nodeid = nodeid_of(case)
        seen.append(nodeid)
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            message = (bad.get("message") or "").strip()
            text = f"{message}\n{bad.text or ''}"
            first = (message or (bad.text or "").strip()).splitlines()
            http = "\n".join(p.get("value") or "" for p in case.iter("property")
                             if p.get("name") == "peer_http")
            cls, feature, note = classify(name, nodeid, text)
            failures.append(Failure(nodeid, first[0] if first else "", text,
                                    bad.text or message, http, cls, feature, note))
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
            entry = lookup(name, nodeid)
            if entry is not None:
                passed_but_listed.append(f"{nodeid}  (listed as {entry.cls}"
                                         f"{': ' + entry.feature if entry.feature else ''})")

    by_class = {cls: [f for f in failures if f.cls == cls] for cls in CLASSES}
    features = Counter(f.feature for f in by_class[UNSUPPORTED])
    if failures or passed_but_listed:
        print(f"{name} failures by class:")
    for cls in CLASSES if failures else ():
        group = by_class[cls]
        detail = ""
        if cls == UNSUPPORTED and group:
            detail = " (" + ", ".join(f"{feat} {features[feat]}" for feat in
                                      sorted(features, key=_feature_order)) + ")"
        print(f"  ({'abcd'[CLASSES.index(cls)]}) {cls}: {len(group)}{detail}")
        for failure in sorted(group, key=lambda f: (_feature_order(f.feature), f.nodeid)):
            tag = f"[{failure.feature}] " if failure.feature else ""
            print(f"      {tag}{failure.nodeid}: {failure.message[:MESSAGE_CHARS]}")
            if cls == PROTOCOL:
                _print_protocol_detail(failure)
    if passed_but_listed:
        print(f"  listed as expected failure but passed: {len(passed_but_listed)}")
        for line in passed_but_listed:
            print(f"      {line}")
    stale = [e.pattern for e in EXPECTED.get(name, []) if not any(e.matches(n) for n in seen)]
    if stale:
        print(f"  {name} table entries that matched no test in this report: {len(stale)}")
        for pattern in stale:
            print(f"      {pattern}")

    summary = f"{name}: {passed} passed, {len(failures)} failed, {skipped} skipped"
    if failures:
        summary += "  (" + ", ".join(f"{cls} {len(by_class[cls])}" for cls in CLASSES) + ")"
    if passed_but_listed:
        summary += f"  [{len(passed_but_listed)} listed as expected failure but passed]"
    print(summary)
    return 1 if by_class[PROTOCOL] else 0


def _feature_order(feature: str) -> int:
    return FEATURES.index(feature) if feature in FEATURES else -1


def _print_protocol_detail(failure: Failure) -> None:
    if failure.note:
        print(f"        why protocol: {failure.note}")
    lines = [line for line in failure.traceback.splitlines() if line.strip()]
    for line in lines[-TRACEBACK_LINES:]:
        print(f"        | {line[:300]}")
    http = failure.http.splitlines()
    if http:
        print("        HTTP exchanges of the test (last ones):")
        for line in http[-HTTP_LINES:]:
            print(f"        > {line[:400]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
