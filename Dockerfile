# Muster image: one image for `muster server` and `muster agent`.
#   docker build -t muster:local .
# Credentials are never baked in: they come from compose secrets / the
# environment at run time (see docs/deployment.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MUSTER_DATA_DIR=/var/lib/muster

# Unprivileged runtime user; its home doubles as the data dir (volume mount).
RUN groupadd --system --gid 10001 muster \
 && useradd --system --uid 10001 --gid muster --home-dir /var/lib/muster \
        --no-create-home --shell /usr/sbin/nologin muster \
 && install -d -o muster -g muster -m 0750 /var/lib/muster

WORKDIR /src
COPY . /src
# psycopg is the PostgreSQL driver for MUSTER_DB_URL=postgresql+psycopg://...
RUN pip install --no-cache-dir . "psycopg[binary]>=3.2" \
 && rm -rf /src

WORKDIR /var/lib/muster
USER muster:muster

# HTTP API, /livez, /readyz, /metrics of `muster server`.
EXPOSE 8080

# Compose sets per-role healthchecks; python is available for them, e.g.
#   python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=3)"
# SIGTERM lets uvicorn / the agent shut down cleanly.
STOPSIGNAL SIGTERM
ENTRYPOINT ["muster"]
CMD ["--help"]
