"""The image receipt (docs/image-receipt.json) and the build figures of docs/container.md, which are read from it.

    python ci/image_receipt.py write      (ci/image.sh, after its checks) write the receipt from the RECEIPT_*
                                          variables and the work folder, then the docs' figures; exit 1 unless
                                          the build and every check passed
    python ci/image_receipt.py docs       rewrite the block between `<!-- receipt: build -->` and
                                          `<!-- end receipt -->` in docs/container.md from the receipt
    python ci/image_receipt.py docs --check   exit 1 when that block is not what the receipt gives

Standard library only: ci/image.sh runs it with whatever Python the host has. tests/test_container.py imports
`docs_block` to check that the docs' figures are the receipt's (no figure in that block is typed by hand).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECEIPT = ROOT / "docs" / "image-receipt.json"
DOCS = ROOT / "docs" / "container.md"
INPUTS = ["Dockerfile", "docker-compose.yml", "requirements/image.lock"]
# The code the in-image checks ran: its SHA-256, so that a receipt made before a change to it can be told apart
# (it is not an input of the image's dependency layers).
CHECKED_CODE = ("launch/checks/doctor.py", "launch/checks/image.py", "launch/checks/traps.py",
                "launch/checks/attention.py", "launch/facts/pins.py", "launch/lockfile.py", "launch/run/runner.py",
                "launch/facts/machine.py")
# The OCI labels ci/image.sh sets (Dockerfile, last stage), from the variables it exports.
LABELS = {"org.opencontainers.image.source": "IMAGE_SOURCE", "org.opencontainers.image.revision": "GIT_REVISION",
          "org.opencontainers.image.version": "IMAGE_RELEASE", "org.opencontainers.image.created": "IMAGE_CREATED",
          "io.llm-recipes.image-lock.sha256": "IMAGE_LOCK_SHA256"}
# The judged runs whose verdicts the receipt records: check name -> run_summary.json (copied by ci/image.sh for
# the first smoke run, which the second one replaces).
JUDGED = {"any-uid": "outputs/any-uid/zero3/run_summary.json", "smoke-zero3": "{work}/smoke-zero3.json",
          "smoke-again": "outputs/zero3/smoke-cpu/run_summary.json",
          "loopback": "outputs/loopback/machine0/run_summary.json"}
# Runs the launcher does not judge itself: the two-machine loopback run, whose layout differs from the recorded
# one-machine profile, is judged by ci/image.sh against it with the launcher's own judge (launch.results.judge).
VERDICTS = {"loopback": "outputs/loopback/verdict.json"}
BEGIN, END = "<!-- receipt: build -->\n", "<!-- end receipt -->"


def inputs_sha256(root: Path = ROOT) -> str:
    return hashlib.sha256(b"".join((root / name).read_bytes() for name in INPUTS)).hexdigest()


# --------------------------------------------------------------------------------------------------------
# writing the receipt


def build_steps(log: str) -> list[dict]:
    """BuildKit's plain progress: "#N [service stage i/n] INSTRUCTION" then "#N DONE 12.3s" or "#N CACHED"."""
    steps, names = [], {}
    for line in log.splitlines():
        if m := re.match(r"#(\d+) \[(?:\S+ )?([^\]]+)\] (.*)", line):
            names.setdefault(m[1], (m[2], m[3]))
        elif (m := re.match(r"#(\d+) (DONE ([\d.]+)s|CACHED)", line)) and m[1] in names:
            stage, instruction = names.pop(m[1])
            steps.append({"stage": stage, "instruction": _quiet(instruction)[:160],
                          "seconds": float(m[3]) if m[3] else 0.0, "cached": m[2] == "CACHED"})
    return steps


def judged(path: Path, verdict_path: Path | None = None) -> dict | None:
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    verdict = summary.get("verdict") or {}
    if verdict_path is not None:
        verdict = json.loads(verdict_path.read_text()) if verdict_path.is_file() else {}
    return {"run_summary": str(path), "exit_status": summary.get("exit_status"),
            "wall_time_s": summary.get("wall_time_s"),
            "versions": summary.get("versions"), "provenance": summary.get("provenance"),
            "verdict_passed": verdict.get("passed"),
            "verdict": [{k: c.get(k) for k in ("check", "value", "limit", "passed")}
                        for c in verdict.get("checks", [])]}


def write(env=os.environ) -> int:
    work = Path(env["RECEIPT_WORK"])
    image = (json.loads((work / "image.json").read_text()) or [{}])[0]
    layers = []
    for row in (work / "history.tsv").read_text().splitlines():
        size, _, created_by = row.partition("\t")
        if size not in ("0B", "0"):
            layers.append({"size": size, "created_by": created_by[:160]})
    checks = []
    for row in (work / "checks.tsv").read_text().splitlines():
        name, rc, seconds, command = row.split("\t", 3)
        out = (work / f"{name}.out").read_text(errors="replace").splitlines()
        checks.append({"name": name, "command": command, "exit_status": int(rc), "passed": rc == "0",
                       "seconds": round(float(seconds), 1), "output_tail": out[-25:]})
    build_ok = env["RECEIPT_BUILD_RC"] == "0"
    labels = ((image.get("Config") or {}).get("Labels")) or {}
    if build_ok:  # the labels the build was given (ci/image.sh's variables), as `docker inspect` shows them
        # the source may be unknown (a clone without a remote); the other labels never are when ci/image.sh builds
        wrong = [f"{key}={labels.get(key)!r}, expected {env.get(var)!r}" for key, var in LABELS.items()
                 if labels.get(key) != env.get(var) or labels.get(key) in (None, "")
                 or (labels.get(key) == "unknown" and var != "IMAGE_SOURCE")]
        lock = hashlib.sha256((ROOT / "requirements" / "image.lock").read_bytes()).hexdigest()
        if labels.get("io.llm-recipes.image-lock.sha256") != lock:
            wrong.append(f"the lock label is not the SHA-256 of requirements/image.lock ({lock})")
        checks.append({"name": "labels", "command": "docker image inspect (Config.Labels)",
                       "exit_status": int(bool(wrong)), "passed": not wrong, "seconds": 0.0,
                       "output_tail": wrong or [f"{k}={labels.get(k)}" for k in LABELS]})
    runs = {name: judged(Path(path.format(work=work)), Path(VERDICTS[name]) if name in VERDICTS else None)
            for name, path in JUDGED.items() if any(c["name"] == name for c in checks)}
    jit = {}
    for c in checks:
        if c["name"] == "jit-cpu-adam":
            for line in c["output_tail"]:
                if m := re.match(r"jit-cpu-adam (first|cached): ([\d.]+) s", line):
                    jit[f"{m[1]}_s"] = float(m[2])
    receipt = {
        "inputs": INPUTS,
        "inputs_sha256": inputs_sha256(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(),
                 "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                 "kernel": platform.release(),
                 # other work on the host slows every figure below: the load when the receipt was written (1, 5,
                 # 15 minutes; the number of runnable processes, against `cpus`)
                 "load_average": [round(x, 1) for x in os.getloadavg()],
                 "docker": subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                                          text=True).stdout.strip(),
                 "compose": subprocess.run(["docker", "compose", "version", "--short"], capture_output=True,
                                           text=True).stdout.strip(),
                 "fresh": [a for a in env.get("RECEIPT_FRESH", "").splitlines() if a],
                 "adaptations": [a for a in env["RECEIPT_ADAPTATIONS"].splitlines() if a]},
        "base_image": {"tag": env["RECEIPT_BASE"], "id": env["RECEIPT_BASE_ID"], "source": env["RECEIPT_BASE_SOURCE"],
                       "debian_version": env["RECEIPT_DEBIAN"], "checked": env.get("RECEIPT_BASE_CHECKED") or None,
                       "seconds": round(float(env["RECEIPT_BASE_SECONDS"]), 1)},
        "build": {"flash_attn": env.get("FLASH_ATTN", "0"), "no_cache": env.get("NO_CACHE", "0") == "1",
                  "exit_status": int(env["RECEIPT_BUILD_RC"]), "seconds": round(float(env["RECEIPT_BUILD_SECONDS"]), 1),
                  "steps": build_steps((work / "build.log").read_text(errors="replace"))},
        "image": {"tag": env["RECEIPT_IMAGE"], "id": image.get("Id"), "size_bytes": image.get("Size"),
                  "size_gb": round((image.get("Size") or 0) / 1e9, 2), "labels": labels, "layers": layers},
        "checks": checks,
        "checked_code_sha256": {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
                                for name in CHECKED_CODE if (ROOT / name).exists()},
        "jit_cpu_adam": jit or None,
        "smoke_zero3": runs.get("smoke-zero3"),
        "judged_runs": runs,
        "total_seconds": round(float(env["RECEIPT_TOTAL_SECONDS"]), 1),
    }
    receipt["passed"] = (build_ok and bool(checks) and all(c["passed"] for c in checks)
                         and all(r is not None and r["verdict_passed"] is True for r in runs.values()))
    Path(env["RECEIPT_OUT"]).write_text(json.dumps(receipt, indent=2) + "\n")
    print(f"ci/image.sh: build {'ok' if build_ok else 'FAILED'} in {receipt['build']['seconds']} s, image "
          f"{receipt['image']['size_gb']} GB; checks: "
          + ", ".join(f"{c['name']} {'ok' if c['passed'] else 'FAILED'}" for c in checks))
    print(f"ci/image.sh: wrote {env['RECEIPT_OUT']} (passed: {receipt['passed']})")
    if Path(env["RECEIPT_OUT"]).resolve() == RECEIPT.resolve():
        sync_docs(receipt)
        print(f"ci/image.sh: wrote the build figures of {DOCS.relative_to(ROOT)} from it")
    return 0 if receipt["passed"] else 1


# --------------------------------------------------------------------------------------------------------
# the docs' figures


# Prefixes that say nothing about a step: the build-secret line of the pip steps, the shell BuildKit runs.
NOISE = (r"if \[ -s /run/secrets/build_ca \]; then export PIP_CERT=/run/secrets/build_ca; fi; ", r"--mount=\S+ ",
         r"/bin/bash -o pipefail -c ", r"\|\d+ [A-Z_]+=\S+ ")


def _quiet(text: str) -> str:
    text = re.sub(r"\s+", " ", text)
    for pattern in NOISE:
        text = re.sub(pattern, "", text)
    return text.strip()


def _step_row(step: dict) -> str:
    instruction = _quiet(step["instruction"])
    if len(instruction) > 70:
        instruction = instruction[:67] + "..."
    cached = " (cached)" if step["cached"] else ""
    return f"| `{step['stage']}` | `{instruction.replace('|', '/')}` | {step['seconds']:.1f}{cached} |"


def docs_block(receipt: dict) -> str:
    """The build figures of docs/container.md ("Build time and size"), every number read from the receipt."""
    host, build, base, image = receipt["host"], receipt["build"], receipt["base_image"], receipt["image"]
    fresh = "; ".join(host.get("fresh") or []) or "nothing recorded as fresh"
    lines = [
        f"Measured by `bash ci/image.sh` on {receipt['date'][:10]} (`docs/image-receipt.json`): {host['cpus']} cores, "
        f"{host['memory_gib']} GiB RAM (load average at the end, 1/5/15 min: "
        f"{'/'.join(str(x) for x in host.get('load_average') or []) or '?'}), Docker {host['docker']}, "
        f"Compose {host.get('compose') or '?'}; "
        f"{'`--no-cache` build' if build.get('no_cache') else 'build with the layer cache'}, {fresh}. "
        f"Base image `{base['tag']}` ({base['source']}, Debian {base['debian_version']}): {base['seconds']:.1f} s.",
        "",
        "| stage | step | seconds |",
        "|---|---|---|",
    ]
    lines += [_step_row(s) for s in build["steps"] if s["stage"] != "internal" and (s["seconds"] >= 0.5 or s["cached"])]
    lines.append(f"| | **build total** (`docker compose build`) | **{build['seconds']:.1f}** |")
    for c in receipt["checks"]:
        if c["name"] != "labels":
            lines.append(f"| check | {c['name']} | {c['seconds']:.1f} |")
    lines.append(f"| | **`bash ci/image.sh` total** | **{receipt['total_seconds']:.1f}** |")
    lines.append("")
    biggest = sorted(image["layers"], key=lambda layer: _bytes(layer["size"]), reverse=True)[:4]
    lines.append(f"Image size: {image['size_gb']} GB ({image['size_bytes']:,} bytes); its largest layers: "
                 + "; ".join(f"{layer['size']} (`{_short(layer['created_by'])}`)" for layer in biggest) + ".")
    if jit := receipt.get("jit_cpu_adam"):
        lines.append(f"DeepSpeed's `cpu_adam` op (zero3-offload), JIT-compiled at first use: {jit.get('first_s')} s on "
                     f"this host, {jit.get('cached_s')} s to load once built (the `jit-cpu-adam` check).")
    runs = receipt.get("judged_runs") or {}
    if runs:
        fresh_volume = any("cache volume" in f for f in host.get("fresh") or [])
        lines.append("The judged runs inside the image (launcher wall time, judged against the recipe's expected "
                     "metrics): " + "; ".join(
                         f"{name} {run.get('wall_time_s')} s ({'passed' if run.get('verdict_passed') else 'FAILED'})"
                         for name, run in runs.items() if run)
                     + " (in that order: any-uid first, on a cache volume "
                     + ("created by this run" if fresh_volume else "used before") + ").")
    return "\n".join(lines) + "\n"


def _bytes(size: str) -> float:
    m = re.match(r"([\d.]+)\s*([kMG]?B)", size)
    return float(m[1]) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[m[2]] if m else 0.0


def _short(created_by: str) -> str:
    text = _quiet(created_by).replace("|", "/") or "the base image"
    return text[:60] + ("..." if len(text) > 60 else "")


def block_in(text: str) -> str | None:
    start = text.find(BEGIN)
    end = text.find(END, start + len(BEGIN)) if start >= 0 else -1
    return text[start + len(BEGIN):end] if start >= 0 and end >= 0 else None


def sync_docs(receipt: dict, path: Path = DOCS) -> None:
    text = path.read_text()
    old = block_in(text)
    if old is None:
        raise SystemExit(f"{path}: no {BEGIN.strip()} ... {END} block")
    path.write_text(text.replace(BEGIN + old + END, BEGIN + docs_block(receipt) + END, 1))


def main(argv: list[str]) -> int:
    if argv == ["write"]:
        return write()
    if argv[:1] == ["docs"] and argv[1:] in ([], ["--check"]):
        receipt = json.loads(RECEIPT.read_text())
        if argv[1:] == ["--check"]:
            ok = block_in(DOCS.read_text()) == docs_block(receipt)
            print("docs/container.md's build figures are the receipt's" if ok else
                  "docs/container.md's build figures differ from docs/image-receipt.json: "
                  "python ci/image_receipt.py docs")
            return 0 if ok else 1
        sync_docs(receipt)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
