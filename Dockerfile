# One slim, non-root image for every Gym server (`gymckpt serve <server>`), the operator (`gym-operator`) and
# the chart's helpers (`gymckpt forward` in front of the in-cluster S3 store, `gymckpt cluster` in the
# upgrade hooks). Build it, push it to a registry your cluster pulls from, and give the chart that name:
#
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm      # the "Digest: sha256:..." line
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> \
#     -t registry.example.com/ml/gym-checkpoint:0.1.0 .
#   docker push registry.example.com/ml/gym-checkpoint:0.1.0
#   helm install gym charts/gym-checkpoint --set image.repository=registry.example.com/ml/gym-checkpoint
#
# Two stages: the builder installs the pinned dependencies (docker/requirements.lock, every wheel's sha256 checked:
# --require-hashes) into a virtual environment before any source is copied, so a code change rebuilds only the
# last, small layer; the runtime stage copies that environment onto the same base, without pip's caches or build
# files.

# The base image, by digest: required, so a build can never change underneath you (a tag moves when the image is
# rebuilt). The build stops when PYTHON_IMAGE has no @sha256: digest; the image name it expects is CPython 3.11 on
# Debian bookworm (the lock's wheels are for glibc 2.36), e.g. python:3.11.14-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE

FROM ${PYTHON_IMAGE} AS builder
ARG PYTHON_IMAGE
RUN case "${PYTHON_IMAGE}" in \
      *@sha256:????????????????????????????????????????????????????????????????) ;; \
      *) echo "PYTHON_IMAGE=${PYTHON_IMAGE} is not pinned by digest: build with --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> (docker buildx imagetools inspect python:3.11.14-slim-bookworm shows it)" >&2; exit 1 ;; \
    esac
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Dependencies first, from the lock alone: this layer changes only when the lock does.
COPY docker/requirements.lock docker/build.lock /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-deps --only-binary=:all: --require-hashes -r /tmp/requirements.lock \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install --no-deps --only-binary=:all: --require-hashes -r /tmp/build.lock
# Then the project: its wheel built with the pinned backend, installed without resolving anything.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY operator ./operator
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheels . \
    && /opt/venv/bin/pip install --no-deps /tmp/wheels/gym_checkpoint-*.whl \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gym-checkpoint" \
      org.opencontainers.image.description="Partial-rollout checkpointing for reinforcement-learning Gym servers: servers, operator and tools" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://gym-checkpoint.dev" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN groupadd --system --gid 10001 gymckpt \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/gymckpt --create-home \
       --shell /usr/sbin/nologin gymckpt
COPY --from=builder /opt/venv /opt/venv
WORKDIR /home/gymckpt
# Any UID works (OpenShift assigns its own); 10001 is the default the chart also sets.
USER 10001:10001
EXPOSE 8000 8001
ENTRYPOINT ["gymckpt"]
CMD ["--help"]
