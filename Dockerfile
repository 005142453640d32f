# syntax=docker/dockerfile:1
# GPU image for the recipes: `docker compose run recipe RECIPE [flags] [-- training args]`
# runs `python -m launch RECIPE ...` (ENTRYPOINT below; there is no CMD). See docs/container.md.
#
# Versions: every Python package the image installs, transitive ones included, is pinned in
# requirements/image.lock, resolved by `bash requirements/lock.sh` from requirements/pins.txt (the direct
# versions) for CPython 3.12 on x86_64 manylinux; CI checks that it resolves and pins the whole set. Every
# install below is `pip install --no-deps` from that lock or its subset image-build.lock, so pip resolves and
# picks nothing; the last layer checks that what is installed is exactly image.lock, and
# `python -m launch doctor` checks it again at every start. No version is written in this file: to change
# one, edit requirements/pins.txt and run `bash requirements/lock.sh`.
#
# Base image: CUDA 13.0.3 devel, because the PyPI Linux wheel of torch 2.13.0 (the pin) is a CUDA 13.0
# build: its metadata requires `cuda-toolkit[...]==13.0.3`, `nvidia-cudnn-cu13`, `nvidia-nccl-cu13` (all in
# image.lock). torch brings its own CUDA runtime, cuDNN and NCCL as wheels; the base image provides nvcc and
# headers of the same CUDA release for the flash-attn build and DeepSpeed's JIT ops. The build checks that the
# two agree (see the torch layer). The host driver must support CUDA 13.0 (R580 or newer).
# Pinned by exact tag only, not by digest: the digest was not observable from where this file was written
# (no registry access) and NVIDIA re-pushes tags for security fixes. To freeze it, build with
# --build-arg BASE_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04@sha256:<digest from `docker buildx imagetools inspect`>.
ARG BASE_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Compute capabilities to build for: 8.0 = A100, 9.0 = H100/H200. Add 10.0 for B200. Entries may carry
# PyTorch's suffixes (9.0a, 9.0+PTX): DeepSpeed's JIT ops get the list as it is, flash-attn the derived
# list below.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}

# python3-dev: headers for flash-attn and DeepSpeed JIT builds; g++: host compiler for nvcc;
# libaio-dev: DeepSpeed's async_io op (NVMe offload).
# DL3008 (apt versions not pinned): Ubuntu's archive drops superseded package versions, so `pkg=version`
# pins would break every rebuild after the next security update; the distribution release is fixed by the
# base image tag, and no Python package comes from apt except the interpreter.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates \
        g++ \
        libaio-dev \
        python3 \
        python3-dev \
        python3-venv \
    && rm -rf /var/lib/apt/lists/*

# Python 3.12 (Ubuntu 24.04) in a virtual environment: the system interpreter is externally managed
# (PEP 668). The venv's pip is the one bundled with the distribution's python3-venv.
RUN python3 -m venv "${VIRTUAL_ENV}"

# --- Dependency layers (before any source COPY) ---------------------------------------------------------
# Wheels only (--only-binary=:all:), except the packages published as source only (the names in
# requirements/uv.toml), which are built here without build isolation, against what is already installed.
#
# 1. torch with all its dependencies (the CUDA 13.0 libraries, triton, ...) and flash-attn's build
#    dependencies (setuptools, wheel, packaging, psutil, ninja, einops): exactly image-build.lock, the subset
#    of image.lock these two layers need, so that the long flash-attn layer stays cached when an unrelated
#    pin changes. Fail here, not at run time, when torch's CUDA and the base image's CUDA differ.
COPY requirements/image-build.lock /opt/pins/image-build.lock
RUN grep -v '^flash-attn==' /opt/pins/image-build.lock > /opt/pins/torch-layer.txt \
    && pip install --no-cache-dir --no-deps --only-binary=:all: -r /opt/pins/torch-layer.txt \
    && pip check \
    && python -c "import os, torch; t = torch.version.cuda; b = os.environ['CUDA_VERSION']; \
print(f'torch {torch.__version__} built for CUDA {t}; base image CUDA {b}'); \
assert t and t.split('.')[:2] == b.split('.')[:2], 'torch CUDA build does not match the base image: set BASE_IMAGE'"

# 2. flash-attn's targets. flash-attn 2.8.3 passes its own -gencode flags, read from FLASH_ATTN_CUDA_ARCHS,
#    whose entries it matches exactly against 80, 90, 100 and 120 (an entry it does not know is dropped
#    without a word, so "90a" would leave H100 without a kernel), and it builds SASS only (no PTX). Derived
#    from TORCH_CUDA_ARCH_LIST: the suffixes a, f (arch/family-specific) and +PTX are dropped, and each
#    capability maps to the flash-attn target whose SASS it runs (same major, lower or equal minor): 8.0, 8.6,
#    8.7, 8.9 -> 80; 9.0 -> 90; 10.0, 10.3 -> 100; 12.0, 12.1 -> 120. Any other entry stops the build.
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

# 3. flash-attn, built from source against the torch installed above (no prebuilt wheel exists for
#    torch 2.13, and a wheel built for another torch fails at import with an undefined symbol):
#    --no-build-isolation so the build sees that torch; FLASH_ATTENTION_FORCE_BUILD so setup.py does not
#    try to download a prebuilt wheel; version from image-build.lock. Importing flash_attn_2_cuda catches an
#    ABI mismatch with torch; cuobjdump shows that every target got its kernels.
#    Memory: flash-attn's setup.py puts the peak at 8-9 GB per compile job with nvcc at 4 threads, and nvcc's
#    threads compile the targets of one file in parallel, so the peak is roughly
#    MAX_JOBS x min(NVCC_THREADS, number of targets) x 2-2.5 GB: about 10 GB with the defaults (4 x 1), where
#    flash-attn's own default (4 threads) would need about 20 GB for two targets and 36 GB for four.
#    NVCC_THREADS=2 compiles two targets at once (what flash-attn's default does with two), for twice the memory.
ARG MAX_JOBS=4
ARG NVCC_THREADS=1
RUN FLASH_ATTN_CUDA_ARCHS="$(cat /opt/pins/flash-attn-archs)" \
    FLASH_ATTENTION_FORCE_BUILD=TRUE \
    MAX_JOBS="${MAX_JOBS}" \
    NVCC_THREADS="${NVCC_THREADS}" \
    pip install --no-cache-dir --no-deps --no-build-isolation --no-binary=flash-attn -c /opt/pins/image-build.lock flash-attn \
    && pip check \
    && so="$(python -c 'import torch, flash_attn, flash_attn_2_cuda; print(flash_attn_2_cuda.__file__)')" \
    && if command -v cuobjdump > /dev/null; then \
        kernels=" $(cuobjdump --list-elf "${so}" | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')"; \
        echo "flash_attn_2_cuda kernels:${kernels}"; \
        for arch in $(tr ';' ' ' < /opt/pins/flash-attn-archs); do \
            case "${kernels}" in *" sm_${arch} "*) ;; *) echo "flash_attn_2_cuda has no sm_${arch} kernel" >&2; exit 1 ;; esac; \
        done; \
    else echo "cuobjdump not found: flash-attn's kernel list not checked"; fi

# 4. Everything else: exactly image.lock (requirements/image.in, resolved). DeepSpeed's CUDA/C++ ops are
#    NOT prebuilt (DS_BUILD_OPS=0): the ops a recipe uses (e.g. cpu_adam for zero3-offload) are JIT-compiled
#    at first use with nvcc from the base image, for TORCH_CUDA_ARCH_LIST, into TORCH_EXTENSIONS_DIR on the
#    cache volume, so that happens once per volume, not per run; prebuilding every op would add a long build
#    step for ops no recipe uses. DeepSpeed is built from its sdist without build isolation (it sees the
#    installed torch). The build sees no GPU, so DeepSpeed does not add nvidia-ml-py to its requirements
#    (it does only when it detects a CUDA device while building): its requirements are then the ones
#    requirements/uv.toml declares, and `pip check` fails if that ever differs.
COPY requirements/image.lock /opt/pins/image.lock
RUN DS_BUILD_OPS=0 pip install --no-cache-dir --no-deps --no-build-isolation \
        --only-binary=:all: --no-binary=deepspeed,flash-attn -r /opt/pins/image.lock \
    && pip check \
    && pip freeze --all > /opt/pins/installed.txt

# --- Non-root user (declared after the dependency layers: changing the UID rebuilds only what follows) ---
# User that owns /app, /cache and the outputs: set to the host's `id -u` / `id -g` so that files written
# to the ./outputs bind mount belong to the host user (docker-compose.yml passes HOST_UID / HOST_GID).
# USER_UID=0 (a host user that is root, common on GPU machines): no user is created and the image runs as
# root, like that host user. Otherwise a user already holding USER_UID (ubuntu:24.04 ships `ubuntu`, uid
# 1000) is removed, a group already holding USER_GID is reused, and `app` is created; --no-log-init keeps a
# large UID from growing /var/log/lastlog and faillog to gigabytes. /app/outputs exists and is the user's
# for `docker run` without the bind mount.
ARG USER_UID=1000
ARG USER_GID=1000
RUN if [ "${USER_UID}" != 0 ]; then \
        existing_user="$(getent passwd "${USER_UID}" | cut -d: -f1)"; \
        if [ -n "${existing_user}" ]; then userdel "${existing_user}"; fi \
        && { getent group "${USER_GID}" > /dev/null || groupadd --gid "${USER_GID}" app; } \
        && useradd --no-log-init --uid "${USER_UID}" --gid "${USER_GID}" --create-home --shell /bin/bash app; \
    fi \
    && mkdir -p /app/outputs /cache/huggingface /cache/torch_extensions /cache/triton \
    && chown -R "${USER_UID}:${USER_GID}" /app /cache

# --- Source ------------------------------------------------------------------------------------------------
WORKDIR /app
COPY --chown=${USER_UID}:${USER_GID} . /app
# Editable install: `launch` stays in /app, where it finds recipes/ and requirements/. Then the environment is
# checked against the lock: every package of image.lock at its version and nothing else (pip and this
# project aside).
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /app \
    && python -m launch.pins check --exact requirements/image.lock

# Caches on the volume mounted at /cache (docker-compose.yml): Hugging Face hub/datasets, DeepSpeed and
# torch JIT extensions, Triton kernels. No token is stored in the image: HF_TOKEN comes from the
# environment at run time only.
ENV HF_HOME=/cache/huggingface \
    TORCH_EXTENSIONS_DIR=/cache/torch_extensions \
    TRITON_CACHE_DIR=/cache/triton \
    DS_BUILD_OPS=0 \
    LAUNCH_DOCTOR_AT_START=1
VOLUME ["/cache"]

USER ${USER_UID}:${USER_GID}

# Exec form, no CMD: `docker run IMAGE ring-cp-8gpu --max-steps 5` runs `python -m launch ring-cp-8gpu --max-steps 5`.
ENTRYPOINT ["python", "-m", "launch"]
