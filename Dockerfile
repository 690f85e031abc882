# One slim, non-root image for every Gym server (`gymckpt serve <server>`) and the operator (`kopf run`).
# Build: docker build -t gym-checkpoint:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 gymckpt \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/gymckpt --create-home \
       --shell /usr/sbin/nologin gymckpt

WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY operator ./operator
RUN pip install --no-cache-dir ".[operator]" \
    && rm -rf /src

WORKDIR /home/gymckpt
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["gymckpt"]
CMD ["--help"]
