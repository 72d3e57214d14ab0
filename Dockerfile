# syntax=docker/dockerfile:1
# One image for every Rallypoint service; the command picks the service:
#   docker run rallypoint:dev serve scheduler --nats-url nats://...
# See docs/deployment.md.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- build: a self-contained virtualenv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rally
ENV PATH=/opt/rally/bin:$PATH
WORKDIR /src

# Dependencies first, from pyproject.toml alone, so source edits do not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

# Extra packages for the node-agent image, e.g. --build-arg EXTRA_PIP_PACKAGES="torch==2.13.0"
# (training ranks run as child processes of the agent, inside its container).
ARG EXTRA_PIP_PACKAGES=""
RUN if [ -n "$EXTRA_PIP_PACKAGES" ]; then pip install $EXTRA_PIP_PACKAGES; fi

# The project itself (libs/ as `rallypoint`, services/ as `rallypoint_services`, console script `rally`).
COPY . .
RUN pip install --no-deps . && rally --help > /dev/null

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="rallypoint" \
      org.opencontainers.image.description="Event-sourced gang scheduler for distributed training (all services)"
ENV PATH=/opt/rally/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN groupadd --system --gid 10001 rally \
    && useradd --system --uid 10001 --gid rally --home-dir /var/lib/rally --create-home --shell /usr/sbin/nologin rally
COPY --from=build /opt/rally /opt/rally
COPY deploy/docker/healthcheck.py /opt/rally/healthcheck.py

USER 10001:10001
WORKDIR /var/lib/rally

# api listens here (--http-port); other services serve /healthz on RALLY_HEALTH_PORT (8081 in our manifests).
EXPOSE 8080 8081

# Checks the api by default; services that set RALLY_HEALTH_PORT are checked on that port instead.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/rally/healthcheck.py"]

# SIGTERM lets a service drain its NATS connection and exit cleanly.
STOPSIGNAL SIGTERM
ENTRYPOINT ["rally"]
CMD ["serve", "api", "--http-port", "8080"]
