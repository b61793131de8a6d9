"""CI helper: the tests a run skipped because an optional extra was not installed.

`python .ci/extras_tests.py list JUNIT.xml OUT.txt` writes the node ids of the tests that
skipped with "could not import ..." / "No module named ..." (pytest.importorskip's words), one
per line, for `python -m pytest @OUT.txt` once the extras are installed.
`python .ci/extras_tests.py check JUNIT.xml` fails if any test still skipped for a missing module
(then an extra in setup.cfg's `all` does not list what that test imports).
"""

from __future__ import annotations

import pathlib
import sys
import xml.etree.ElementTree as ET

MISSING = ("could not import", "No module named")


def import_skips(junit: str) -> list[str]:
    """Node ids (file, or file::test for a test-level skip) of the import-skipped tests."""
    ids = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        text = f"{skipped.get('message', '')} {skipped.text or ''}"
        if not any(word in text for word in MISSING):
            continue
        classname, name = case.get("classname", ""), case.get("name", "")
        if not classname:  # the whole module skipped at collection: name is its dotted path
            ids.append(name.replace(".", "/") + ".py")
            continue
        parts = classname.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a file; the rest are classes
            path = "/".join(parts[:cut]) + ".py"
            if pathlib.Path(path).is_file():
                ids.append("::".join([path, *parts[cut:], name]))
                break
        else:
            raise SystemExit(f"extras_tests: cannot find the file of test {classname}.{name}")
    return ids


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "list":
        ids = import_skips(argv[2])
        pathlib.Path(argv[3]).write_text("".join(f"{node}\n" for node in ids))
        print(f"extras_tests: {len(ids)} tests skipped for a missing optional extra")
        return 0
    if len(argv) == 3 and argv[1] == "check":
        ids = import_skips(argv[2])
        for node in ids:
            print(f"extras_tests: still skipped for a missing module: {node}", file=sys.stderr)
        return 1 if ids else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
