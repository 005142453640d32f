"""Nothing in the repository cites what its users cannot follow.

Every tracked text file (`git ls-files`, binary files skipped) is searched for three kinds of citation that lead
nowhere for a user of this public repository:
- notes kept outside the repository, by their file names (`NOTES`);
- numbers of an internal tracker: the word "issue" or "issues" followed by a number (`TRACKER`). A public upstream
  reference names its project and a `#`, which this does not match: "TRL PR #6846", "DeepSpeed #7718",
  "Liger-Kernel issue #803" stay;
- absolute paths of a developer's machine: a checkout under the top-level work folder, root's home, a user's home
  folder under home or Users (`MACHINE_PATH`). Paths inside the container image or of the system (/app, /opt/pins,
  /usr/bin, /tmp, /etc) are not machine paths, and neither are the image's own ones in `IMAGE_PATHS`.

A fact from outside cites its public source (a paper, an upstream PR or issue, a vendor's page), or the file of this
repository that holds the data (GPU reports: benchmarks/results/).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

NOTES = re.compile(r"\b(?:DESIGN|REFERENCE|GPU-MEASURED)\.md\b")
TRACKER = re.compile(r"\bissues? \d+", re.IGNORECASE)
MACHINE_PATH = re.compile(
    r"(?<![\w.~$-])"  # an absolute path, not a part of a relative one (runs/work/, ~/root/, $HOME/work)
    r"(?:/(?:work|root)\b|/(?:home|Users)/[\w.-]+)")
# Paths the container image itself has, not a developer's machine: the Dockerfile's app user's HOME and BuildKit's
# pip cache of the root build stage; the home field of a passwd entry (the image's users, in the container tests'
# fake getent).
IMAGE_PATHS = re.compile(r"/home/app\b|/(?:root)/\.cache/pip\b|/(?:root|home/[\w.-]+)(?=:/)")
KINDS = (("a note outside the repository", NOTES), ("an internal tracker number", TRACKER),
         ("a path of a developer's machine", MACHINE_PATH))


def tracked_files(root: Path = REPO) -> list[str]:
    """The files git tracks under root (those of the working tree: a tracked file deleted meanwhile is left out)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (root / name).is_file()]


def find_citations(root: Path, names: Iterable[str]) -> list[str]:
    """`FILE:LINE: what: the matched text` for every citation of `KINDS` in the text files `names` under root;
    binary files (a NUL byte, or not UTF-8) are skipped."""
    found = []
    for name in names:
        data = (root / name).read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for what, pattern in KINDS:
            for m in pattern.finditer(text):
                if pattern is MACHINE_PATH and IMAGE_PATHS.match(text, m.start()):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                found.append((name, line, f"{name}:{line}: {what}: {m.group(0)!r}"))
    return [f for *_, f in sorted(found)]


def test_nothing_tracked_cites_what_users_cannot_follow():
    found = find_citations(REPO, tracked_files())
    assert not found, (f"{len(found)} citation(s) a user cannot follow (cite the public source or the repository's "
                       "own file instead, or drop it):\n" + "\n".join(found))


def test_the_scanner_finds_each_forbidden_form_and_spares_public_references(tmp_path):
    # each forbidden form is written with a "^" inside, removed here, so that this file itself stays clean
    forbidden = [line.replace("^", "") for line in [
        "as the design says (DESIGN^.md)",
        "see REFERENCE^.md, Throughput conventions",
        "rows of GPU-MEASURED^.md",
        "the bug of iss^ue 18",
        "(Iss^ue 35 item 5)",
        "iss^ue 33's fix",
        "iss^ues 33 and 34",
        "read /wo^rk/shared/notes",
        "cd /wo^rk",
        "wheels in /ro^ot/wheels",
        "python /ho^me/alice/llm/check.py",
        "open /Us^ers/bob/Downloads/report.md",
    ]]
    allowed = [
        "TRL PR #6846 and DeepSpeed #7718",
        "Liger-Kernel issue #803, bitsandbytes issue #1945, transformers #46855, NeMo Automodel #1592",
        "the image's HOME=/home/app and /app/outputs, pins in /opt/pins/cpu.txt",
        "RUN --mount=type=cache,target=/root/.cache/pip pip install",
        "root:x:0:0:root:/root:/bin/bash and ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash",
        "/usr/bin/env, /tmp/run, /etc/hosts, /workspace of the NGC image",
        "bash ci/setup.sh --bundle ~/wheels; benchmarks/work/ddp; $HOME/work/x; root / 'work'",
        "see benchmarks/results/ and docs/planning.md",
        "two issues, an issue's thread",
    ]
    (tmp_path / "notes.txt").write_text("\n".join(forbidden + allowed) + "\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0 iss" + b"ue 1 /wo" + b"rk/x")
    found = find_citations(tmp_path, ["notes.txt", "image.png"])
    lines = sorted(int(f.split(":")[1]) for f in found)
    assert lines == list(range(1, len(forbidden) + 1)), "\n".join(found)
    assert all(f.startswith("notes.txt:") for f in found)
    assert any("a note outside the repository" in f for f in found)
    assert any("an internal tracker number" in f for f in found)
    assert any("a path of a developer's machine" in f for f in found)
