# GPU image for the recipes: `docker compose run recipe RECIPE [flags] [-- training args]`
# runs `python -m launch RECIPE ...` (ENTRYPOINT below; there is no CMD). See docs/container.md.
# Needs BuildKit (Docker's default builder since 23.0; Compose v2 uses it on 20.10 too): stages are built only
# when needed and the pip cache is a cache mount. No `# syntax=` line: the builder's own Dockerfile frontend is
# used, so that nothing but the base image and the package indexes (Debian, PyPI) is fetched.
#
# Versions and hashes: every Python package the image installs, transitive ones included, is pinned in
# requirements/image.lock with the sha256 of its files, resolved by `bash requirements/lock.sh` from
# requirements/pins.txt (the direct versions) for CPython 3.13 (Debian 13's python3) on x86_64 manylinux; CI
# checks that it resolves and pins the whole set. Every install below is `pip install --require-hashes --no-deps`
# from that lock or one of its subsets, so pip resolves and picks nothing and refuses any file whose bytes differ
# from the locked ones (the two source packages, DeepSpeed and the opt-in flash-attn, included); the last layer
# checks that what is installed is exactly image.lock (plus flash-attn with FLASH_ATTN=1), and `python -m launch
# doctor` checks it again at every start. Two installs cannot be hash-checked and are said so where they are:
# flash-attn's wheel, compiled in this build from its hash-checked sdist, and this repository (editable). No
# Python package version is written in this file: to change one, edit requirements/pins.txt and run
# `bash requirements/lock.sh`.
#
# Base image: plain Debian 13 (trixie), pinned by point release. No CUDA base image: the CUDA 13.0 runtime,
# cuDNN, NCCL, cuBLAS, ... come only as the PyPI wheels torch 2.13.0 requires (cuda-toolkit 13.0.3,
# nvidia-cudnn-cu13, nvidia-nccl-cu13, all in image.lock), so no system CUDA library exists that could shadow
# the cuDNN torch was built with (a system cuDNN ahead of torch's sends SDPA to a slower path: transformers
# #48324/#48163, 373 s -> 606 s per 1M-token step); the torch layer checks that. nvcc is not in the default
# image: nothing a recipe runs needs it (DeepSpeed's cpu_adam is a C++ op built with g++; Triton and
# liger-kernel compile with the driver's JIT and gcc; flash-attn-4 is Python, JIT-compiled by the CuTe DSL
# libraries its wheels bring). The opt-in flash-attn stage gets nvcc from PyPI wheels.
# Every input is reachable from any Linux host with internet: Docker Hub's debian image, deb.debian.org and
# PyPI; where Docker Hub is not (a mirror-only network), ci/image.sh assembles the same Debian release with
# mmdebstrap, checks that it is the release the tag names, and imports it under this tag. The tag is rebuilt
# with security fixes; to freeze it, build with BASE_IMAGE=debian:13.8-slim@sha256:<digest> (the digest:
# `docker pull debian:13.8-slim && docker image inspect --format '{{index .RepoDigests 0}}' debian:13.8-slim`;
# see docs/container.md).
# The host driver must support CUDA 13.0 (R580 or newer): NVIDIA_REQUIRE_CUDA below makes the NVIDIA container
# toolkit refuse to start the container on an older driver, and doctor checks it again.
#
# One image for every user: it runs as the fixed non-root user `app` (1000:1000) by default and under any other
# UID a runtime sets (docker --user, compose's HOST_UID, Kubernetes' runAsUser, enroot/pyxis's caller): the code
# is root's and read-only, while /cache, /app/outputs and HOME are writable by any UID. OCI labels (source,
# revision, version, created, the image lock's sha256) are set last, from build arguments ci/image.sh fills in;
# /opt/pins/image.json holds the same facts for `run_summary.json` (launch/facts/machine.py).
ARG BASE_IMAGE=debian:13.8-slim
# 1: add flash-attn 2, compiled from source in its own stage (hours on a small host: see that stage).
ARG FLASH_ATTN=0

FROM ${BASE_IMAGE} AS system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# System packages, pinned to the upstream version of Debian 13.8 with the Debian revision left open
# (`=3.13.5-*`): a security update (+deb13uN) replaces the old revision in the archive, so an exact pin would
# break every rebuild after it, while the upstream version cannot move within a Debian release.
#   python3.13, python3.13-venv: the interpreter (image.lock's target) and its venv module;
#   python3-pip-whl: the pip that python3.13-venv puts into the venv (pip 25.1.1), so pip itself is pinned;
#   python3.13-dev, g++: headers and compiler for DeepSpeed's JIT ops (cpu_adam for zero3-offload) and for
#     the small launcher stubs Triton compiles at run time (liger-kernel's kernels);
#   libaio-dev: DeepSpeed's async_io op (NVMe offload);
#   libibverbs1, ibverbs-providers: rdma-core's verbs library and its drivers (mlx5, efa, ...), which NCCL opens
#     for InfiniBand/RoCE between nodes (without them NCCL falls back to TCP sockets);
#   ca-certificates: TLS to the Hugging Face hub.
# apt's caches never stay in a layer, whatever the base: Docker Hub's debian image cleans them through its
# docker-clean apt hook, a base assembled with mmdebstrap has no such hook, so they are removed here and the
# step fails if any package file or index is left.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates=20250419* \
        g++=4:14.2.0-* \
        ibverbs-providers=56.1-* \
        libaio-dev=0.3.113-* \
        libibverbs1=56.1-* \
        python3-pip-whl=25.1.1+dfsg-* \
        python3.13=3.13.5-* \
        python3.13-dev=3.13.5-* \
        python3.13-venv=3.13.5-* \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && left="$(find /var/cache/apt /var/lib/apt/lists -type f \( -name '*.deb' -o -name '*.bin' -o -name '*_Packages*' -o -name '*_InRelease' \) | head -5)" \
    && if [ -n "${left}" ]; then echo "apt caches left in the layer: ${left}" >&2; exit 1; fi

# A virtual environment: Debian's interpreter is externally managed (PEP 668).
RUN python3.13 -m venv "${VIRTUAL_ENV}" && pip --version

# pip's downloads: the cache is a BuildKit cache mount (kept by the builder, never in a layer). The optional
# build secret `build_ca` is a CA bundle for a TLS-intercepting proxy (ci/image.sh passes the host's when the
# host has extra CAs); it is used as PIP_CERT for that RUN only and is not stored in the image.

# --- torch with its CUDA 13.0 libraries ------------------------------------------------------------------
# Exactly image-build.lock (torch and its dependencies, a subset of image.lock), copied on its own so that this
# large layer stays cached when an unrelated pin changes. Wheels only, hash-checked. Then: torch's CUDA release
# equals the locked cuda-toolkit's, and no CUDA library exists outside the venv's wheels (nothing in the linker
# cache, no LD_LIBRARY_PATH) that could be loaded instead of torch's own cuDNN, NCCL or cuBLAS.
FROM system AS torch
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY requirements/image-build.lock /opt/pins/image-build.lock
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi; \
    pip install --require-hashes --no-deps --only-binary=:all: -r /opt/pins/image-build.lock \
    && pip check \
    && toolkit="$(sed -n 's/^cuda-toolkit==\([^ ]*\).*/\1/p' /opt/pins/image-build.lock)" \
    && python -c "import sys, torch; t = torch.version.cuda; k = sys.argv[1]; \
print(f'torch {torch.__version__} built for CUDA {t}; locked cuda-toolkit {k}'); \
assert t and t.split('.')[:2] == k.split('.')[:2], 'torch CUDA build does not match the locked cuda-toolkit'" "${toolkit}" \
    && if ldconfig -p | grep -E 'lib(cudart|cudnn|nccl|cublas)\.so'; then echo "system CUDA libraries found" >&2; exit 1; fi \
    && test -z "${LD_LIBRARY_PATH:-}"

# --- flash-attn (opt-in: FLASH_ATTN=1) --------------------------------------------------------------------
# No prebuilt wheel of flash-attn 2.8.3 exists for torch 2.13 + CUDA 13 (PyPI has the sdist only; upstream's
# wheels stop at torch release 2.10, and a wheel built for another torch fails at import with an undefined
# symbol), so it is compiled here, against the torch above, in a stage of its own: with the default
# FLASH_ATTN=0 this stage is never built, and once built it stays cached until torch or flash-attn.lock change.
# The default image has FlashAttention without this compile: flash-attn-4 (image.lock), on Hopper and Blackwell.
# nvcc, its front end and the CUB/Thrust headers come from PyPI (cuda-toolkit 13.0.3's nvcc and cccl wheels,
# flash-attn.lock, hash-checked), laid out as a CUDA_HOME for torch's extension builder (lib64, libcudart.so).
# The lock's entries are split with awk (an entry is its `name==version \` line and the `--hash` lines under it):
# /opt/pins/flash-attn-tools.lock is the lock without flash-attn, /opt/pins/flash-attn-sdist.lock its one entry.
# Cost (nvcc 13.0, torch 2.13 headers): one kernel file takes 4-6.3 min on one core at 4.9-6.9 GB of RAM; 72
# files, about 6 core-hours: estimated 3 h on 2 cores, 25-45 min on 16 (MAX_JOBS below). Checked here with the
# patch below: flash_api.cpp and one forward kernel file for target 90 compile with g++ 14 in 110 s at 5.0 GB.
# C++ standard: flash-attn's setup.py passes -std=c++17, while torch 2.13's headers use C++20 (warnings now, an
# error with torch's next release, 2.14; fixed only on flash-attn's main branch, PRs #2879/#2899): the sdist is
# patched to -std=c++20, and the build stops if the patch no longer applies.
FROM torch AS flash-attn-build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY requirements/flash-attn.lock /opt/pins/flash-attn.lock
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi; \
    awk '/^[^ #]/ { keep = ($1 !~ /^flash-attn==/) } keep' /opt/pins/flash-attn.lock > /opt/pins/flash-attn-tools.lock \
    && awk '/^[^ #]/ { keep = ($1 ~ /^flash-attn==/) } keep && !/^[[:space:]]*#/' /opt/pins/flash-attn.lock > /opt/pins/flash-attn-sdist.lock \
    && pip install --require-hashes --no-deps --only-binary=:all: -r /opt/pins/flash-attn-tools.lock \
    && pip check \
    && cuda="$(python -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')" \
    && ln -s lib "${cuda}/lib64" \
    && ln -s libcudart.so.13 "${cuda}/lib/libcudart.so" \
    && ln -s "${cuda}" /opt/cuda \
    && /opt/cuda/bin/nvcc --version
ENV CUDA_HOME=/opt/cuda

# flash-attn's targets, from TORCH_CUDA_ARCH_LIST. flash-attn 2.8.3 passes its own -gencode flags, read from
# FLASH_ATTN_CUDA_ARCHS, whose entries it matches exactly against 80, 90, 100 and 120 (an entry it does not
# know is dropped without a word, so "90a" would leave H100 without a kernel), and it builds SASS only (no
# PTX). The suffixes a, f (arch/family-specific) and +PTX are dropped, and each capability maps to the
# flash-attn target whose SASS it runs (same major, lower or equal minor): 8.0, 8.6, 8.7, 8.9 -> 80; 9.0 -> 90;
# 10.0, 10.3 -> 100; 12.0, 12.1 -> 120. Any other entry stops the build.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
RUN archs=""; \
    for entry in $(echo "${TORCH_CUDA_ARCH_LIST}" | tr ';,' '  '); do \
        cc="${entry%+PTX}"; cc="${cc%[af]}"; \
        case "${cc}" in \
            8.0|8.6|8.7|8.9) arch=80 ;; \
            9.0) arch=90 ;; \
            10.0|10.3) arch=100 ;; \
            12.0|12.1) arch=120 ;; \
            *) echo "TORCH_CUDA_ARCH_LIST entry '${entry}': flash-attn 2 builds for 8.x, 9.0, 10.0/10.3 and 12.0/12.1 only" >&2; exit 1 ;; \
        esac; \
        case ";${archs};" in *";${arch};"*) ;; *) archs="${archs:+${archs};}${arch}" ;; esac; \
    done; \
    if [ -z "${archs}" ]; then echo "TORCH_CUDA_ARCH_LIST is empty" >&2; exit 1; fi; \
    echo "${archs}" > /opt/pins/flash-attn-archs \
    && echo "flash-attn targets: ${archs} (TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST})"

# Compile jobs: MAX_JOBS, or with MAX_JOBS=auto as many as both the cores and the memory allow: 7 GB per job
# and per target nvcc compiles at once (min(NVCC_THREADS, targets)), from the available memory or the cgroup's
# limit, whichever is lower; at least 1.
ARG MAX_JOBS=auto
ARG NVCC_THREADS=1
RUN jobs="${MAX_JOBS}"; \
    if [ "${jobs}" = auto ]; then \
        targets="$(tr ';' '\n' < /opt/pins/flash-attn-archs | wc -l)"; \
        mem_kb="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"; \
        for limit in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do \
            if [ -r "${limit}" ] && [ "$(cat "${limit}")" != max ]; then \
                cg_kb=$(( $(cat "${limit}") / 1024 )); if [ "${cg_kb}" -lt "${mem_kb}" ]; then mem_kb="${cg_kb}"; fi; \
            fi; \
        done; \
        per_job_kb=$(( 7 * 1000 * 1000 * (NVCC_THREADS < targets ? NVCC_THREADS : targets) )); \
        jobs=$(( mem_kb / per_job_kb )); cores="$(nproc)"; \
        if [ "${jobs}" -gt "${cores}" ]; then jobs="${cores}"; fi; \
        if [ "${jobs}" -lt 1 ]; then jobs=1; fi; \
    fi; \
    case "${jobs}" in ''|*[!0-9]*|0) echo "MAX_JOBS must be auto or a positive number, not '${MAX_JOBS}'" >&2; exit 1 ;; esac; \
    echo "${jobs}" > /opt/pins/flash-attn-jobs \
    && echo "flash-attn compile jobs: ${jobs} (MAX_JOBS=${MAX_JOBS}, NVCC_THREADS=${NVCC_THREADS})"

# The build: the sdist at flash-attn.lock's version, its hash checked against the lock (metadata read without
# compiling), patched to C++20, compiled into a wheel in /wheels. Importing flash_attn_2_cuda catches an ABI
# mismatch with torch; the kernels in its fat binary (the ELF entries' architectures, read from the fatbin
# headers: the nvcc wheel has no cuobjdump) must cover every target.
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi; \
    version="$(sed -n 's/^flash-attn==\([^ ]*\).*/\1/p' /opt/pins/flash-attn.lock)" \
    && grep -q "^flash-attn==${version} " /opt/pins/flash-attn-sdist.lock \
    && FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip download --require-hashes --no-deps --no-build-isolation \
        --no-binary=flash-attn -d /tmp/flash-attn -r /opt/pins/flash-attn-sdist.lock \
    && tar -xzf /tmp/flash-attn/flash_attn-*.tar.gz -C /tmp/flash-attn \
    && src="$(echo /tmp/flash-attn/flash_attn-*/)" \
    && test "$(grep -c -- '-std=c++17' "${src}setup.py")" -ge 2 \
    && sed -i 's/-std=c++17/-std=c++20/g' "${src}setup.py" \
    && jobs="$(cat /opt/pins/flash-attn-jobs)" \
    && echo "flash-attn: MAX_JOBS=${jobs} NVCC_THREADS=${NVCC_THREADS} targets=$(cat /opt/pins/flash-attn-archs)" \
    && FLASH_ATTN_CUDA_ARCHS="$(cat /opt/pins/flash-attn-archs)" \
        FLASH_ATTENTION_FORCE_BUILD=TRUE \
        MAX_JOBS="${jobs}" \
        NVCC_THREADS="${NVCC_THREADS}" \
        pip wheel --no-deps --no-build-isolation -w /wheels "${src}" \
    && pip install --no-deps /wheels/flash_attn-*.whl \
    && so="$(python -c 'import torch, flash_attn, flash_attn_2_cuda; print(flash_attn_2_cuda.__file__)')" \
    && kernels=" $(python -c "$(printf '%s\n' \
        'import struct, sys' \
        'data, archs, pos = open(sys.argv[1], "rb").read(), set(), 0' \
        'while (pos := data.find(struct.pack("<I", 0xBA55ED50), pos)) >= 0:' \
        '    _, header, size = struct.unpack_from("<HHQ", data, pos + 4); entry, end = pos + header, pos + header + size' \
        '    while entry + 32 <= end:' \
        '        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)' \
        '        archs |= {struct.unpack_from("<I", data, entry + 28)[0]} if kind == 2 else set()' \
        '        entry = end if entry_header == 0 else entry + entry_header + payload' \
        '    pos = max(end, pos + 4)' \
        'print(" ".join(f"sm_{a}" for a in sorted(archs)))')" "${so}") " \
    && echo "flash_attn_2_cuda kernels:${kernels}" \
    && for arch in $(tr ';' ' ' < /opt/pins/flash-attn-archs); do \
        case "${kernels}" in *" sm_${arch} "*) ;; *) echo "flash_attn_2_cuda has no sm_${arch} kernel" >&2; exit 1 ;; esac; \
    done \
    && rm -rf /tmp/flash-attn

# The wheels the final stage installs: none (FLASH_ATTN=0, the stage above is not built) or flash-attn's.
FROM torch AS flash-attn-0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN mkdir -p /wheels
FROM flash-attn-build AS flash-attn-1
# DL3006 (untagged image): flash-attn-0/1 are the stages above, not images from a registry.
# hadolint ignore=DL3006
FROM flash-attn-${FLASH_ATTN} AS flash-attn-wheels

# --- Everything else: exactly image.lock -------------------------------------------------------------------
# DeepSpeed's ops are NOT prebuilt (DS_BUILD_OPS=0): DeepSpeed compiles its C++ ops with -march=native, so an op
# built here would be built for this build host's CPU and could stop with an illegal instruction on another
# (the image is shared through a registry). The op a recipe uses (cpu_adam, zero3-offload) is JIT-compiled at
# first use into TORCH_EXTENSIONS_DIR on the cache volume, for the CPU it runs on; ninja compiles it again when
# the installed sources are newer than the build (pip writes every file at install time, so after each rebuild
# of this layer). Its cost is measured by ci/image.sh (the receipt's jit-cpu-adam check). DeepSpeed is built from
# its sdist (hash-checked) without build isolation (it sees the installed torch). The build sees no GPU, so
# DeepSpeed does not add nvidia-ml-py to its requirements (it does only when it detects a CUDA device while
# building): its requirements are then the ones requirements/uv.toml declares, and `pip check` fails if that
# ever differs. /opt/pins/expected.lock: what the last layer checks the environment against.
FROM torch AS image
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY requirements/image.lock /opt/pins/image.lock
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi; \
    DS_BUILD_OPS=0 pip install --require-hashes --no-deps --no-build-isolation \
        --only-binary=:all: --no-binary=deepspeed -r /opt/pins/image.lock \
    && pip check \
    && cp /opt/pins/image.lock /opt/pins/expected.lock

# flash-attn 2 (FLASH_ATTN=1): its wheel was compiled in this build from the hash-checked sdist, so it has no
# locked hash. Its wheel also ships an older copy of the `flash_attn/cute` sources that flash-attn-4 installs:
# flash-attn-4 is installed again afterwards (from its locked, hash-checked entry) so that its own files win.
ARG FLASH_ATTN
RUN --mount=type=bind,from=flash-attn-wheels,source=/wheels,target=/wheels \
    if [ "${FLASH_ATTN}" = 1 ]; then \
        pip install --no-cache-dir --no-deps /wheels/flash_attn-*.whl \
        && awk '/^[^ #]/ { keep = ($1 ~ /^flash-attn-4==/) } keep && !/^[[:space:]]*#/' /opt/pins/image.lock > /tmp/flash-attn-4.lock \
        && pip install --no-cache-dir --require-hashes --no-deps --only-binary=:all: --force-reinstall -r /tmp/flash-attn-4.lock \
        && rm /tmp/flash-attn-4.lock \
        && pip freeze | grep -i '^flash[-_]attn==' >> /opt/pins/expected.lock \
        && python -c 'import torch, flash_attn, flash_attn_2_cuda'; \
    elif [ "${FLASH_ATTN}" != 0 ]; then echo "FLASH_ATTN must be 0 or 1, not ${FLASH_ATTN}" >&2; exit 1; \
    fi \
    && pip check \
    && pip freeze --all > /opt/pins/installed.txt

# --- The user (fixed) and the directories any runtime UID writes -------------------------------------------
# `app` (1000:1000) is the default user. A runtime may set any other UID (compose's HOST_UID so that files in
# ./outputs are the host user's; Kubernetes' runAsUser; enroot/pyxis run as the caller): /cache (the volume's
# mount point: Docker copies these modes into a new named volume), /app/outputs and HOME are world-writable with
# the sticky bit (each UID writes its own entries and cannot remove another's), so no rebuild per UID is needed.
# A base image user already holding UID 1000 is removed first; --no-log-init keeps /var/log/lastlog small.
RUN existing_user="$(getent passwd 1000 | cut -d: -f1)"; \
    if [ -n "${existing_user}" ]; then userdel "${existing_user}"; fi \
    && { getent group 1000 > /dev/null || groupadd --gid 1000 app; } \
    && useradd --no-log-init --uid 1000 --gid 1000 --home-dir /home/app --create-home --shell /bin/bash app \
    && mkdir -p /cache/huggingface /cache/torch_extensions /cache/triton /cache/flash-attn-4 /cache/llm-recipes \
    && chmod 1777 /cache /cache/huggingface /cache/torch_extensions /cache/triton /cache/flash-attn-4 /cache/llm-recipes \
        /home/app

# --- Source (root's, read-only to the runtime user) ----------------------------------------------------------
WORKDIR /app
COPY . /app
# Editable install: `launch` stays in /app, where it finds recipes/ and requirements/ (a local tree: not
# hash-checked, and --no-deps, so it adds nothing). The code stays root's and not writable by anyone else
# (go-w, whatever the build context's modes); /app/outputs is the one writable folder under /app. Then the
# environment is checked against the lock: every package of image.lock at its version and nothing else (pip and
# this project aside; flash-attn too with FLASH_ATTN=1).
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /app \
    && chmod -R go-w /app \
    && mkdir -p /app/outputs && chmod 1777 /app/outputs \
    && python -m launch.lockfile check --exact /opt/pins/expected.lock

# Caches on the volume mounted at /cache (docker-compose.yml): Hugging Face hub/datasets, DeepSpeed and
# torch JIT extensions, Triton kernels, flash-attn-4's compiled kernels (its persistent JIT cache, keyed by a
# fingerprint of its sources and of the CuTe DSL's version, so a new version compiles afresh), the smoke
# profile's tiny model and data (RECIPES_CACHE). No token is
# stored in the image: HF_TOKEN comes from the environment at run time only. HOME is set (a UID without a
# passwd entry would otherwise get HOME=/). NVIDIA_*: what the NVIDIA container toolkit mounts (the CUDA driver
# library, nvidia-smi) and the driver it requires (CUDA 13.0, R580+), as NVIDIA's CUDA images declare them.
ENV HOME=/home/app \
    HF_HOME=/cache/huggingface \
    TORCH_EXTENSIONS_DIR=/cache/torch_extensions \
    TRITON_CACHE_DIR=/cache/triton \
    FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/cache/flash-attn-4 \
    RECIPES_CACHE=/cache/llm-recipes \
    DS_BUILD_OPS=0 \
    LAUNCH_DOCTOR_AT_START=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
VOLUME ["/cache"]

# --- Provenance: OCI labels and /opt/pins/image.json (last, so that a new revision rebuilds only these) -----
# ci/image.sh passes the repository's URL, its commit (with -dirty when the tree has uncommitted changes), the
# project's version and the build time; a plain `docker compose build` leaves them `unknown`. The image lock's
# sha256 is computed here from the lock that was installed, and a value passed in must equal it.
ARG IMAGE_SOURCE=unknown
ARG GIT_REVISION=unknown
ARG IMAGE_RELEASE=unknown
ARG IMAGE_CREATED=unknown
ARG IMAGE_LOCK_SHA256=unknown
ARG BASE_IMAGE
RUN lock_sha256="$(sha256sum /opt/pins/image.lock | cut -d' ' -f1)" \
    && if [ "${IMAGE_LOCK_SHA256}" != unknown ] && [ "${IMAGE_LOCK_SHA256}" != "${lock_sha256}" ]; then \
        echo "IMAGE_LOCK_SHA256=${IMAGE_LOCK_SHA256} but the installed image.lock is ${lock_sha256}" >&2; exit 1; fi \
    && python -c 'import json, sys; keys = ("source", "revision", "version", "created", "image_lock_sha256", "flash_attn"); \
print(json.dumps(dict(zip(keys, sys.argv[1:])), indent=2))' \
        "${IMAGE_SOURCE}" "${GIT_REVISION}" "${IMAGE_RELEASE}" "${IMAGE_CREATED}" "${lock_sha256}" "${FLASH_ATTN}" \
        > /opt/pins/image.json \
    && cat /opt/pins/image.json
LABEL org.opencontainers.image.title="llm-recipes" \
      org.opencontainers.image.description="Distributed LLM fine-tuning recipes (TRL SFTTrainer on Accelerate, DeepSpeed, FSDP2): python -m launch" \
      org.opencontainers.image.source="${IMAGE_SOURCE}" \
      org.opencontainers.image.revision="${GIT_REVISION}" \
      org.opencontainers.image.version="${IMAGE_RELEASE}" \
      org.opencontainers.image.created="${IMAGE_CREATED}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.llm-recipes.image-lock.sha256="${IMAGE_LOCK_SHA256}" \
      io.llm-recipes.flash-attn="${FLASH_ATTN}"

USER 1000:1000

# Exec form, no CMD: `docker run IMAGE ring-cp-8gpu --max-steps 5` runs `python -m launch ring-cp-8gpu --max-steps 5`.
ENTRYPOINT ["python", "-m", "launch"]
