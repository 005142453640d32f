# syntax=docker/dockerfile:1
# GPU image for the recipes: `docker compose run recipe RECIPE [flags] [-- training args]`
# runs `python -m launch RECIPE ...` (ENTRYPOINT below; there is no CMD). See docs/container.md.
#
# Versions: every Python package version comes from requirements/pins.txt (constraints file), never from
# this file. TORCH_VERSION / FLASH_ATTN_VERSION may override a pin; the override is written into the
# image's copy of pins.txt, so `python -m launch doctor` inside the image checks what was really installed.
#
# Base image: CUDA 13.0.3 devel, because the PyPI Linux wheel of torch 2.13.0 (the pin) is a CUDA 13.0
# build: its metadata requires `cuda-toolkit[...]==13.0.3`, `nvidia-cudnn-cu13`, `nvidia-nccl-cu13`
# (read with `pip install --dry-run --no-deps --report`). torch brings its own CUDA runtime, cuDNN and
# NCCL as wheels; the base image provides nvcc and headers of the same CUDA release for the flash-attn
# build and DeepSpeed's JIT ops. The build checks that the two agree (see the torch layer).
# The host driver must support CUDA 13.0 (R580 or newer).
# Pinned by exact tag only, not by digest: the digest was not observable from where this file was written
# (no registry access) and NVIDIA re-pushes tags for security fixes. To freeze it, build with
# --build-arg BASE_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04@sha256:<digest from `docker buildx imagetools inspect`>.
ARG BASE_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04

# ---------------------------------------------------------------------------------------------------------
# Stage `pins`: the effective pins (with any override applied), and the subset the flash-attn build
# depends on. Copying only that subset into the main stage keeps the long flash-attn layer cached when an
# unrelated pin (trl, datasets, ...) changes.
FROM ${BASE_IMAGE} AS pins
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Empty = the version in requirements/pins.txt.
ARG TORCH_VERSION=""
ARG FLASH_ATTN_VERSION=""
COPY requirements/pins.txt /pins/pins.txt
RUN set_pin() { \
        grep -q "^$1==" /pins/pins.txt || { echo "no '$1==' line in requirements/pins.txt" >&2; exit 1; }; \
        if [ -n "$2" ]; then sed -i "s/^$1==.*/$1==$2/" /pins/pins.txt; fi; \
    }; \
    set_pin torch "${TORCH_VERSION}" \
    && set_pin flash-attn "${FLASH_ATTN_VERSION}" \
    && grep -E '^(torch|flash-attn|packaging|psutil|ninja|einops|setuptools|wheel)==' /pins/pins.txt > /pins/build-core.txt \
    && cat /pins/build-core.txt

# ---------------------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Compute capabilities to build for: 8.0 = A100, 9.0 = H100/H200 (SASS for 8.0 also runs on 8.6/8.9).
# Two targets instead of flash-attn's default four (80;90;100;120) halves its build time. Add 10.0 for B200.
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
# 1. torch and flash-attn's build dependencies, at their pins. PyPI's torch 2.13.0 Linux wheel is the
#    CUDA 13.0 build. Fail here, not at run time, when torch's CUDA and the base image's CUDA differ.
COPY --from=pins /pins/build-core.txt /opt/pins/build-core.txt
RUN pip install --no-cache-dir -c /opt/pins/build-core.txt torch packaging psutil ninja einops \
    && python -c "import os, torch; t = torch.version.cuda; b = os.environ['CUDA_VERSION']; \
print(f'torch {torch.__version__} built for CUDA {t}; base image CUDA {b}'); \
assert t and t.split('.')[:2] == b.split('.')[:2], 'torch CUDA build does not match the base image: set BASE_IMAGE'"

# 2. flash-attn, built from source against the torch installed above (no prebuilt wheel exists for
#    torch 2.13, and a wheel built for another torch fails at import with an undefined symbol):
#    --no-build-isolation so the build sees that torch; FLASH_ATTENTION_FORCE_BUILD so setup.py does not
#    try to download a prebuilt wheel; version from the constraints file. flash-attn 2.8.3 reads its
#    target list from FLASH_ATTN_CUDA_ARCHS (it passes its own -gencode flags, so TORCH_CUDA_ARCH_LIST
#    alone would not narrow it); both are derived from the one TORCH_CUDA_ARCH_LIST argument.
#    Importing flash_attn_2_cuda at build time catches an ABI mismatch with torch.
# Parallel compile jobs for flash-attn; each needs roughly 9 GB of RAM (flash-attn's setup.py).
ARG MAX_JOBS=4
RUN FLASH_ATTN_CUDA_ARCHS="$(echo "${TORCH_CUDA_ARCH_LIST}" | tr -d .)" \
    FLASH_ATTENTION_FORCE_BUILD=TRUE \
    MAX_JOBS="${MAX_JOBS}" \
    pip install --no-cache-dir --no-build-isolation -c /opt/pins/build-core.txt flash-attn \
    && python -c "import flash_attn, flash_attn_2_cuda; print('flash-attn', flash_attn.__version__)"

# 3. Everything else the image needs (requirements/gpu.txt), constrained by the full pin file.
#    DeepSpeed's CUDA/C++ ops are NOT prebuilt (DS_BUILD_OPS=0): the ops a recipe uses (e.g. cpu_adam for
#    zero3-offload) are JIT-compiled at first use with nvcc from the base image, for TORCH_CUDA_ARCH_LIST,
#    into TORCH_EXTENSIONS_DIR on the cache volume, so that happens once per volume, not per run; prebuilding
#    every op would add a long build step for ops no recipe uses. DeepSpeed is published as an sdist only;
#    it is installed first with --no-build-isolation so its build sees the installed torch.
COPY --from=pins /pins/pins.txt /opt/pins/pins.txt
COPY requirements/gpu.txt /opt/pins/gpu.txt
RUN DS_BUILD_OPS=0 pip install --no-cache-dir --no-build-isolation -c /opt/pins/pins.txt deepspeed \
    && pip install --no-cache-dir -c /opt/pins/pins.txt -r /opt/pins/gpu.txt \
    && pip check \
    && pip freeze --all > /opt/pins/installed.txt

# --- Non-root user (declared after the dependency layers: changing the UID rebuilds only what follows) ---
# User that owns /app, /cache and the outputs: set to the host's `id -u` / `id -g` so that files written
# to the ./outputs bind mount belong to the host user (docker-compose.yml passes HOST_UID / HOST_GID).
ARG USER_UID=1000
ARG USER_GID=1000
# ubuntu:24.04 ships a user `ubuntu` with uid 1000: a user already holding USER_UID is removed, a group
# already holding USER_GID is reused.
RUN if existing_user="$(getent passwd "${USER_UID}" | cut -d: -f1)" && [ -n "${existing_user}" ]; then \
        userdel "${existing_user}"; \
    fi; \
    if ! getent group "${USER_GID}" > /dev/null; then groupadd --gid "${USER_GID}" app; fi; \
    useradd --uid "${USER_UID}" --gid "${USER_GID}" --create-home --shell /bin/bash app \
    && mkdir -p /app /cache/huggingface /cache/torch_extensions /cache/triton \
    && chown -R "${USER_UID}:${USER_GID}" /app /cache

# --- Source ------------------------------------------------------------------------------------------------
WORKDIR /app
COPY --chown=${USER_UID}:${USER_GID} . /app
# Editable install: `launch` stays in /app, where it finds recipes/ and requirements/pins.txt. The image's
# pins.txt is the effective one (differs from the repository's only when a version was overridden).
RUN cp /opt/pins/pins.txt /app/requirements/pins.txt \
    && pip install --no-cache-dir --no-deps --no-build-isolation -e /app

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
