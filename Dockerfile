# syntax=docker/dockerfile:1
# gpuwarden: one image for `gpuwarden serve` (webhook), `gpuwarden node-agent` and the CLI.
# Build: docker build -t gpuwarden/gpuwarden:0.1.0 .
#
# Stage 1 builds the gpuwarden wheel and collects the wheels of all its dependencies.
# Stage 2 installs them from that directory only (no index, no compilers, no build tools) and
# runs as an unprivileged user. There is no HEALTHCHECK: Kubernetes probes /healthz and /readyz
# (see charts/gpuwarden), and Docker's HEALTHCHECK is ignored by Kubernetes anyway.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY gpuwarden ./gpuwarden
# Dependencies must come as binary wheels: the final image has no compiler to fall back on.
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && pip wheel --only-binary=:all: --wheel-dir /wheels /wheels/gpuwarden-*.whl

FROM ${PYTHON_IMAGE}
ARG UID=65532
LABEL org.opencontainers.image.title="gpuwarden" \
      org.opencontainers.image.description="Multi-tenant GPU governance for Kubeflow: admission webhooks, node agent, dry-run CLI" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# Installed from the build stage's wheels through a bind mount, so no wheel stays in a layer.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/gpuwarden-*.whl \
    && groupadd --gid "${UID}" gpuwarden \
    && useradd --uid "${UID}" --gid "${UID}" --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpuwarden
USER ${UID}:${UID}
WORKDIR /tmp
ENTRYPOINT ["gpuwarden"]
CMD ["--help"]
