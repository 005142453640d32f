#!/usr/bin/env bash
# Sets up a pinned virtualenv from a lock of requirements/: creates it when absent, installs the lock when what
# is installed differs from it, installs this repository (editable: `launch` importable from the train
# scripts). A no-op, in about a second, when everything already matches.
#
#   bash ci/setup.sh [--check]           the CPU virtualenv from requirements/cpu.lock (CPython 3.11). Used by
#                                        ci/test.sh (the tests) and ci/launch.sh (the launcher).
#   bash ci/setup.sh --gpu [--check]     a GPU host without Docker: the virtualenv from requirements/image.lock,
#                                        exactly what the image installs (torch's CUDA 13.0 build and its CUDA
#                                        libraries as PyPI wheels; CPython 3.13, the lock's target)
#   bash ci/setup.sh --bundle DIR [--python-version X.Y] [--platform TAG] [--list] [NAME...]
#                                        on a machine with network, for a GPU machine without: downloads into DIR
#                                        the wheels of image.lock less the torch build (torch, triton, the CUDA
#                                        wheels: the GPU machine's own torch brings them), for that machine's
#                                        Python (default the lock's, 3.13) and platform (default the lock's,
#                                        manylinux_2_28_x86_64), each file checked against the lock's hashes;
#                                        DIR/bundle.lock lists them, DIR/bundle.json says what for. --list prints
#                                        the packages and downloads nothing; NAME...: only these packages.
#   bash ci/setup.sh --from DIR [--check] on the GPU machine, offline: the virtualenv from DIR (--no-index) on top
#                                        of the machine's own torch (PYTHON: the interpreter that imports it). DIR is
#                                        checked first (launch.lockfile bundle-check: made from this checkout's
#                                        image.lock, for PYTHON's version and platform, a file of the right sha256
#                                        for every entry); a bundle that cannot install says why and what to run,
#                                        before anything is created
#
#   VENV=.venv       where the virtualenv lives, relative to the repository (default .venv; --gpu and --from:
#                    .venv-gpu); DIR is relative to the current folder
#   PYTHON=python3   the interpreter that creates it: the lock's target version (CPU: 3.11; --gpu: 3.13; --from:
#                    the bundle's, the Python of the machine's torch)
#   --check          change nothing: exit 0 when the virtualenv matches the lock, 1 when not
#
# --gpu and --from write a setup marker into the virtualenv (llm-recipes-setup.json, by launch.lockfile's `mark`):
# the lock it was set up from, and from a bundle the packages left to the machine's torch build; `python -m launch
# doctor` judges the environment against that lock and reports the machine's torch build beside it without failing
# on it. The marker is written only when every package of the lock (the bundle's) is installed inside the virtualenv
# at its version: a bundle's venv also sees the machine's packages, and pip installs nothing for a package it finds
# there at the locked version, so --from installs those into the venv afterwards (--ignore-installed).
#
# A virtualenv this run created is removed when the setup fails: no half-made venv is left behind.
#
# torch is its CPU build (torch==<pin>+cpu in the lock), which is not on the package index: it is taken from a
# wheel directory pip is already configured with (PIP_FIND_LINKS, pip.conf), else from PyTorch's CPU wheel page.
# Every install of a lock is hash-checked (`--require-hashes`): each file fetched (torch's CPU wheel included,
# wherever it comes from) must have one of the sha256 hashes its lock entry lists, or nothing is installed. The CPU
# lock is installed by the uv it pins (in parallel, with pip's index settings; below says why), the GPU locks and
# bundles by pip. This repository itself is installed editable afterwards, on its own (a local tree has no hash).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
usage="usage: bash ci/setup.sh [--check] | --gpu [--check] | --bundle DIR [--python-version X.Y] [--platform TAG] [--list] [NAME...] | --from DIR [--check]"
check_only=false
mode=cpu
list_only=false
dir=""
bundle_python=""
bundle_platform=""
names=()
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check_only=true ;;
        --gpu) mode=gpu ;;
        --bundle|--from)
            mode=${1#--}
            [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
            dir=$2; shift ;;
        --python-version|--platform)
            [ "$mode" = bundle ] && [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
            if [ "$1" = --platform ]; then bundle_platform=$2; else bundle_python=$2; fi
            shift ;;
        --list) [ "$mode" = bundle ] || { echo "$usage" >&2; exit 2; }; list_only=true ;;
        -*) echo "$usage" >&2; exit 2 ;;
        *) [ "$mode" = bundle ] || { echo "$usage" >&2; exit 2; }; names+=("$1") ;;
    esac
    shift
done
if [ "$mode" = bundle ] && $check_only; then echo "$usage" >&2; exit 2; fi
case "$dir" in ""|/*) ;; *) dir="$caller/$dir" ;; esac   # DIR: relative to where the command was given
LOCK=requirements/cpu.lock
case "$mode" in
    cpu) VENV=${VENV:-.venv} ;;
    gpu) VENV=${VENV:-.venv-gpu}; LOCK=requirements/image.lock ;;
    from) VENV=${VENV:-.venv-gpu}; LOCK="$dir/bundle.lock" ;;
esac
TORCH_CPU_WHEELS=${TORCH_CPU_WHEELS:-https://download.pytorch.org/whl/cpu/torch/}

# The packages published as source only (the names in requirements/uv.toml) are built here without build
# isolation, by the build backends of the lock, which are installed first; everything else is a wheel.
source_only=$(sed -n 's/^name = "\(.*\)"$/\1/p' requirements/uv.toml | paste -sd, -)
# lock_entries LOCK NAME...: those entries of LOCK with their --hash lines (awk: launch.lockfile needs `packaging`,
# which a new virtualenv does not have yet)
lock_entries() {
    awk -v names=" ${*:2} " '/^[^ #]/ { split($1, a, "=="); keep = index(names, " " tolower(a[1]) " ") > 0 }
                             keep && !/^[[:space:]]*#/' "$1"
}
# The lock's target, from its `# target: cpython-3.11 x86_64-manylinux_2_28` line (requirements/lock.sh writes it)
lock_target() { sed -n 's/^# target: cpython-\([0-9][0-9.]*\) \([a-z0-9_]*\)-\(.*\)$/\1 \3_\2/p' "$1" | head -1; }
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# --- --bundle: the image lock's wheels for a GPU machine with its own torch ------------------------------------
if [ "$mode" = bundle ]; then
    read -r target_python target_platform < <(lock_target requirements/image.lock)
    bundle_python=${bundle_python:-$target_python}
    bundle_platform=${bundle_platform:-$target_platform}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # launch.lockfile lists the bundle (it needs `packaging` only) and pip downloads it (DeepSpeed's sdist: pip reads
    # its metadata with setuptools' own bdist_wheel, setuptools >= 70.1, without build isolation; nothing is built).
    # PYTHON when it has all three, else a throwaway virtualenv with image.lock's packaging and setuptools,
    # hash-checked (--list needs `packaging` only).
    lockfile() { PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$tool" -m launch.lockfile "$@"; }
    tool=$PYTHON
    needs='import packaging, pip, setuptools.command.bdist_wheel'
    $list_only && needs='import packaging'
    if ! "$tool" -c "$needs" > /dev/null 2>&1; then
        "$PYTHON" -m venv "$tmp/venv"
        tool="$tmp/venv/bin/python"
        lock_entries requirements/image.lock packaging setuptools > "$tmp/tools.lock"
        "$tool" -m pip --disable-pip-version-check install --quiet --require-hashes --no-deps --only-binary=:all: \
            -r "$tmp/tools.lock"
    fi
    if $list_only; then
        lockfile bundle "$dir" --python-version "$bundle_python" --platform "$bundle_platform" --list "${names[@]}"
        exit 0
    fi
    lockfile bundle "$dir" --python-version "$bundle_python" --platform "$bundle_platform" "${names[@]}"
    platforms=()
    while read -r tag; do platforms+=(--platform "$tag"); done < <(lockfile platforms "$bundle_platform")
    # --no-deps: bundle.lock is the whole set; --require-hashes: every file against the lock's sha256
    "$tool" -m pip --disable-pip-version-check download --quiet --require-hashes --no-deps --no-build-isolation \
        --only-binary=:all: --no-binary="$source_only" --implementation cp --python-version "$bundle_python" \
        "${platforms[@]}" -d "$dir" -r "$dir/bundle.lock"
    echo "ci/setup.sh: $dir holds $(grep -c '==' "$dir/bundle.lock") packages for CPython $bundle_python $bundle_platform;" \
        "on the GPU machine: PYTHON=<its python with torch> bash ci/setup.sh --from $dir"
    exit 0
fi

# --- the target interpreter --------------------------------------------------------------------------------------
if [ "$mode" = from ]; then
    for file in bundle.lock bundle.json; do
        [ -f "$dir/$file" ] || { echo "ci/setup.sh: $dir/$file not found: make the bundle with \`bash ci/setup.sh --bundle $dir\`" >&2; exit 2; }
    done
    # The bundle against the interpreter it installs for (the venv's when it exists, else PYTHON), before anything is
    # created: launch.lockfile needs `packaging`; an interpreter without it borrows the bundle's own wheel (pure
    # Python, imported from the zip), once its sha256 is one that bundle.lock lists.
    judge=$PYTHON
    [ -x "$VENV/bin/python" ] && judge="$VENV/bin/python"
    pythonpath=$PWD
    if ! "$judge" -c 'import packaging.tags, packaging.utils' > /dev/null 2>&1; then
        wheel=$(find "$dir" -maxdepth 1 -name 'packaging-*-py3-none-any.whl' | head -1)
        if [ -z "$wheel" ] || ! lock_entries "$dir/bundle.lock" packaging | grep -q "sha256:$(sha256sum "$wheel" | cut -d' ' -f1)"; then
            echo "ci/setup.sh: $judge has no \`packaging\` and $dir no packaging wheel of bundle.lock to check the bundle with: set PYTHON to the interpreter of the machine's torch and make the bundle again (bash ci/setup.sh --bundle $dir)" >&2
            exit 2
        fi
        pythonpath="$pythonpath:$wheel"
    fi
    if ! why=$(cd / && PYTHONPATH="$pythonpath" "$judge" -m launch.lockfile bundle-check "$dir" 2>&1); then
        echo "ci/setup.sh: $why" >&2
        exit 2
    fi
    target_python=$(python_version "$judge")
else
    target_python=$(lock_target "$LOCK" | cut -d' ' -f1)
fi
if [ ! -x "$VENV/bin/python" ]; then
    if $check_only; then echo "ci/setup.sh: no virtualenv at $VENV" >&2; exit 1; fi
    if [ "$(python_version "$PYTHON")" != "$target_python" ]; then
        echo "ci/setup.sh: $LOCK is for CPython $target_python but $PYTHON is $(python_version "$PYTHON"): set PYTHON=python$target_python" >&2
        exit 2
    fi
    if [ "$mode" = from ] && ! "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' > /dev/null 2>&1; then
        echo "ci/setup.sh: $PYTHON has no torch: --from builds on the machine's own torch; set PYTHON to the interpreter that has it" >&2
        exit 2
    fi
    echo "ci/setup.sh: creating $VENV"
    # from here on, a failure removes the virtualenv this run created (pip's own output above says why)
    trap 'status=$?; if [ $status -ne 0 ]; then rm -rf "$VENV"; echo "ci/setup.sh: the setup failed (above); removed $VENV, which this run had created" >&2; fi' EXIT
    "$PYTHON" -m venv "$VENV"
    if [ "$mode" = from ]; then
        # The machine's own packages (its torch, triton, CUDA wheels) are seen after the venv's own: a .pth file
        # names the site-packages of PYTHON (a system Python, a conda environment or another virtualenv alike).
        site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/llm-recipes-machine.pth"
    fi
fi
if [ "$(python_version "$VENV/bin/python")" != "$target_python" ]; then
    echo "ci/setup.sh: $VENV is Python $(python_version "$VENV/bin/python"), $LOCK is for $target_python: remove $VENV" >&2
    exit 2
fi

py="$(cd "$VENV" && pwd)/bin/python"
pip() { "$py" -m pip --disable-pip-version-check "$@"; }
case "$mode" in
    cpu) setup_command="ci/setup.sh" ;;
    gpu) setup_command="ci/setup.sh --gpu" ;;
    from) setup_command="ci/setup.sh --from $dir" ;;
esac
# --gpu and --from: the setup marker (the lock, and the packages left to the machine's torch build)
mark() {
    case "$mode" in
        gpu) "$py" -m launch.lockfile mark "$VENV" "$LOCK" "$setup_command" > /dev/null ;;
        from) "$py" -m launch.lockfile mark "$VENV" requirements/image.lock "$setup_command" "$dir" > /dev/null ;;
    esac
}

# Up to date: every package of the lock is installed at its version (launch.lockfile reads the lock; it needs
# `packaging`, so on a new virtualenv this fails and the install runs) and `launch` is this checkout's.
# --gpu and --from: installed inside the venv itself (a bundle's venv sees the machine's packages too).
inside=()
[ "$mode" = cpu ] || inside=(--venv "$VENV")
up_to_date() {
    "$py" -m launch.lockfile check "${inside[@]}" "$LOCK" > /dev/null 2>&1 \
        && [ "$(cd / && "$py" -c 'import launch; print(launch.__file__)' 2>/dev/null)" = "$PWD/launch/__init__.py" ]
}

if up_to_date; then
    $check_only || mark
    echo "ci/setup.sh: $VENV matches $LOCK"
    exit 0
fi
if $check_only; then
    echo "ci/setup.sh: $VENV differs from $LOCK:" >&2
    "$py" -m launch.lockfile check "${inside[@]}" "$LOCK" >&2 || true
    exit 1
fi

echo "ci/setup.sh: installing $LOCK into $VENV"
source=()
if [ "$mode" = from ]; then
    source=(--no-index --find-links "$dir")   # offline: the bundle's files only
fi
torch=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$LOCK")
case "$torch" in
    *+cpu)  # the CPU build: not on the package index
        if ! pip install --quiet --dry-run --no-deps --no-index "torch==$torch" > /dev/null 2>&1; then
            export PIP_FIND_LINKS="${PIP_FIND_LINKS:+$PIP_FIND_LINKS }$TORCH_CPU_WHEELS"
        fi ;;
esac
if [ "$mode" != cpu ]; then
    # DeepSpeed is built as the image builds it, seeing no GPU: with one, its setup.py adds nvidia-ml-py to its
    # requirements (only when torch is importable and sees a CUDA device), which no lock has
    export CUDA_VISIBLE_DEVICES=""
fi
# The build backends first (and on the CPU, uv: below), by pip, hash-checked
tools="setuptools poetry-core"
[ "$mode" = cpu ] && tools="$tools uv"
# shellcheck disable=SC2086  # the names, one argument each
lock_entries "$LOCK" $tools > "$VENV/build-backends.lock"
pip install --quiet --require-hashes --no-deps --only-binary=:all: "${source[@]}" -r "$VENV/build-backends.lock"
rm -f "$VENV/build-backends.lock"
# --no-deps: the lock is the whole set, nothing is resolved or added (pip check proves it is complete)
if [ "$mode" = cpu ]; then
    # The CPU lock (CI's setup, every CI run on a fresh machine) is installed by uv, the lock's own uv (cpu.lock pins
    # it: lock.sh resolves with it): the same hash-checked --no-deps install of the same files, whose downloads,
    # unpacking and byte-compiling (--compile-bytecode: every module compiled once here, as pip does, not in every
    # process that imports it) run in parallel where pip's run one after the other: 49 s instead of 1 min 47 s on a
    # new 2-core machine with empty caches (AMD EPYC, measured). uv does not read pip's configuration, so pip's own
    # index and find-links settings (PIP_* variables, pip.conf: where torch's CPU wheel is, a mirror) are handed to
    # it; --index-strategy unsafe-best-match looks across all of them, as pip does (every file is hash-checked).
    uv_sources=()
    index=""
    while read -r key values; do
        for value in $values; do
            case "$key" in
                index-url) [ -n "$index" ] || index=$value ;;   # the first (pip lists its variables first)
                extra-index-url) uv_sources+=(--extra-index-url "$value") ;;
                find-links) uv_sources+=(--find-links "$value") ;;
                cert) export SSL_CERT_FILE=$value ;;   # pip's certificate bundle (a proxy's CA), for uv too
            esac
        done
    done < <(pip config list | sed -n "s/^[^.]*\.\(index-url\|extra-index-url\|find-links\|cert\)='\(.*\)'$/\1 \2/p")
    [ -z "$index" ] || uv_sources+=(--index-url "$index")
    "$VENV/bin/uv" pip install --quiet --python "$py" --require-hashes --no-deps --no-build-isolation \
        --only-binary :all: --no-binary "$source_only" --compile-bytecode --index-strategy unsafe-best-match \
        "${uv_sources[@]}" -r "$LOCK"
else
    pip install --quiet --require-hashes --no-deps --no-build-isolation --only-binary=:all: --no-binary="$source_only" "${source[@]}" -r "$LOCK"
fi
if [ "$mode" = from ]; then
    # pip installs nothing for a package it sees installed at its locked version, and this venv sees the machine's
    # packages too (the .pth file): those are installed into the venv now, from the bundle. --ignore-installed only
    # for these, which the venv itself does not hold at all (one it held at another version pip has just replaced).
    "$py" -m launch.lockfile missing "$VENV" "$LOCK" > "$VENV/machine-satisfied.lock"
    if [ -s "$VENV/machine-satisfied.lock" ]; then
        echo "ci/setup.sh: installing into $VENV what pip took from the machine's packages:" \
            "$(sed -n 's/==.*//p' "$VENV/machine-satisfied.lock" | paste -sd' ' -)"
        pip install --quiet --require-hashes --no-deps --no-build-isolation --ignore-installed --only-binary=:all: \
            --no-binary="$source_only" "${source[@]}" -r "$VENV/machine-satisfied.lock"
    fi
    rm -f "$VENV/machine-satisfied.lock"
fi
pip install --quiet --no-deps --no-build-isolation "${source[@]}" -e .
if [ "$mode" = from ]; then
    # The machine's packages are visible too (its torch was built with other pins): what pip check says is shown,
    # not fatal; doctor judges the environment against image.lock
    pip check || echo "ci/setup.sh: pip check found the above beside the machine's own packages; \`$py -m launch doctor\` judges the environment against requirements/image.lock" >&2
else
    pip check
fi
if ! up_to_date; then
    echo "ci/setup.sh: $VENV still differs from $LOCK:" >&2
    "$py" -m launch.lockfile check "${inside[@]}" "$LOCK" >&2 || true
    exit 1
fi
mark
trap - EXIT
echo "ci/setup.sh: $VENV matches $LOCK"
