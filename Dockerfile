# configpin container image.
#
#   docker build -t configpin:0.1.0 .
#
# For a bit-for-bit repeatable base, pin it by digest:
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest> -t configpin:0.1.0 .
#
# The runtime dependencies come only from requirements.lock (exact versions and hashes). After
# changing the dependencies in pyproject.toml, regenerate it with the command on its first line.

# Builder and runtime must share one base: the venv's interpreter is a link into it.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

# A C compiler for mypyc, which compiles the decision core (webhook/core) into the wheel; the
# base image has Python's headers. Neither reaches the runtime stage.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

# The build backend (setuptools, and mypy for mypyc), pinned by hash like everything else, in
# a venv of its own so that it stays out of the image.
COPY requirements-build.lock /src/requirements-build.lock
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps --only-binary=:all: \
      -r /src/requirements-build.lock

# The runtime venv has no pip or setuptools of its own: the build venv's pip installs into it.
# Runtime dependencies first: this layer is reused until the lock changes.
RUN python -m venv --without-pip /opt/configpin
COPY requirements.lock /src/requirements.lock
RUN /opt/build/bin/pip --python /opt/configpin/bin/python install \
      --require-hashes --no-deps --only-binary=:all: -r /src/requirements.lock

# Then configpin itself, as a wheel, without letting pip resolve anything: every dependency
# is already there from the lock. CONFIGPIN_COMPILE=1: the core compiled, or no image
# (setup.py; without it a failed compile would fall back to pure Python).
COPY pyproject.toml setup.py README.md /src/
COPY webhook /src/webhook
RUN CONFIGPIN_COMPILE=1 /opt/build/bin/pip wheel --no-deps --no-build-isolation \
      --wheel-dir /wheels /src \
 && /opt/build/bin/pip --python /opt/configpin/bin/python install --no-deps --no-index \
      /wheels/configpin-*.whl \
 && /opt/build/bin/pip --python /opt/configpin/bin/python check


FROM ${PYTHON_IMAGE}
# A named user for the numeric UID, so that tools that look the user up find one. The base
# image's own pip and setuptools go: nothing installs packages at run time.
RUN groupadd --gid 65532 configpin \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin configpin \
 && python -m pip uninstall --yes --quiet pip setuptools wheel
COPY --from=builder /opt/configpin /opt/configpin
# Bytecode was compiled at install time; the root filesystem is read-only at run time.
# In a container configpin listens on every address (its own default is loopback).
ENV PATH=/opt/configpin/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    CONFIGPIN_HOST=0.0.0.0
WORKDIR /tmp
# It also runs as any other UID with group 0, as OpenShift's restricted SCCs assign them (the
# chart's runAsIds): everything under /opt/configpin belongs to root and is readable (and its
# programs runnable) by group 0 and by everyone, and nothing is written outside HOME (/tmp, a
# writable volume in the chart's pods).
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["configpin"]
CMD ["serve"]
