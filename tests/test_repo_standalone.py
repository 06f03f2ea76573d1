"""The repository stands alone: no tracked file refers to a path outside it.

A user clones the repository and has nothing beside it, so no code, script,
test or document may read from (or tell the reader to look in) a sibling
directory of the clone, or name an absolute path of one machine (a project
directory, root's or a user's home). Third-party data under `tests/data` is
checked too. The patterns are built from pieces so this file does not match
itself; the second test shows each pattern catching its bad form.
"""

from __future__ import annotations

import re
import subprocess

import harness

PARENT = r"\.\./"
PATTERNS = {
    "a sibling directory of the clone": re.compile(PARENT + r"(?:\.\./)*shared\b"),
    "a path built from the clone's parent": re.compile(
        r"""(?:parent|parents\[\d+\])\s*/\s*["']""" + "sha" + r"""red["']"""),
    "an absolute path of one machine": re.compile(
        r"(?<![\w.~$)}-])/(?:" + "|".join(["wo" + "rk", "ro" + "ot", "ho" + "me/[a-z_][\\w-]*"]) + r")/"),
}


def tracked_text_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=harness.REPO, check=True,
                         capture_output=True).stdout
    for name in out.decode().split("\0"):
        if not name:
            continue
        path = harness.REPO / name
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue
        if b"\0" in data[:8192]:
            continue  # binary
        yield name, data.decode("utf-8", errors="replace")


def offending_lines(text: str):
    for no, line in enumerate(text.splitlines(), 1):
        for what, pattern in PATTERNS.items():
            if pattern.search(line):
                yield no, what, line.strip()


def test_no_tracked_file_refers_outside_the_repository():
    files = list(tracked_text_files())
    assert len(files) > 100, "git ls-files found too few files: not run inside the clone?"
    hits = [f"{name}:{no}: {what}: {line[:160]}"
            for name, text in files for no, what, line in offending_lines(text)]
    assert not hits, "tracked files refer to paths outside the repository:\n" + "\n".join(hits)


def test_the_check_catches_what_it_must():
    # The patterns above are what keep the first test honest: each known bad
    # form is caught, and ordinary relative or home-relative paths are not.
    sep = "/"
    bad = ["see .." + sep + "shared" + sep + "data/chat-templates",
           'Path(__file__).parents[2] / "sha' + 'red" / "data"',
           "cp " + sep + "wo" + "rk" + sep + "main/x .",
           'default="' + sep + "ro" + "ot" + sep + '.cache/gyre"',
           "open('" + sep + "ho" + "me" + sep + "alice" + sep + "model')"]
    good = ["~/.cache/gyre/target", "$(HOME)/.cache/gyre", "tests/data/chat-templates",
            "../ci-check", "https://example.com/" + "wo" + "rk/x", "src/" + "wo" + "rk/mod.rs"]
    for line in bad:
        assert list(offending_lines(line)), f"not caught: {line}"
    for line in good:
        assert not list(offending_lines(line)), f"wrongly caught: {line}"
