# CPU image of the translation service: onnxruntime (CPU) + the baked default bundle(s) in models/.
#
#   docker build -t nmt-service .
#   docker run --rm -p 8000:8000 nmt-service            # every setting: -e NAME=value
#   docker run --rm nmt-service --help                  # or a flag: ... nmt-service --port 9000
#   docker run --stop-timeout 40 ...                    # room for the stop sequence (docs/deploy.md)
#
# An image cannot set its open-file limit: the service raises its soft limit to the hard one
# the runtime gives (docker run --ulimit nofile=8192:8192, compose's ulimits) and lowers
# MAX_CONNECTIONS to fit when that is too little.
#
# The builder stage makes a virtual environment holding only the runtime dependencies
# ([project.dependencies] of pyproject.toml: no torch) and a wheel of this project; the runtime
# stage copies that environment and the models, and nothing else (no compilers, no build
# tools; the venv has no pip either).

FROM python:3.11.13-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
RUN python3 -m venv /opt/venv

# Dependencies first, read from pyproject.toml, so that a code change reuses this layer.
# EXTRAS=train (--build-arg) adds torch and the importers' dependencies: an image that can run
# `translate-models install` (docker-compose.yml's models service, the Kubernetes init step),
# several GB larger; the serving image leaves it empty.
ARG EXTRAS=""
COPY pyproject.toml README* ./
RUN EXTRAS="$EXTRAS" python3 -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = [e for e in os.environ['EXTRAS'].split(',') if e]; print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt

# The project itself, as a wheel (not editable): the image needs no source tree.
COPY service/ service/
COPY training/ training/
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && /opt/venv/bin/pip install --no-deps /tmp/wheels/*.whl \
    && /opt/venv/bin/python -c "import service.settings, onnxruntime, sentencepiece" \
    && /opt/venv/bin/pip uninstall -y pip setuptools wheel

# The bundles, readable by everyone and writable by no one: COPY keeps the build context's modes,
# and a bundle written with a private umask (0600 files, 0700 directories) would be unreadable to
# the service's non-root user. (`COPY --chmod` would need BuildKit.)
COPY models/ /opt/models/
RUN chmod -R u=rwX,go=rX /opt/models


FROM python:3.11.13-slim-bookworm AS runtime

# Every setting of service/settings.py is an environment variable; these are only defaults
# (`docker run -e PORT=9000 ...` or compose's environment: override any of them).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    HOST=0.0.0.0 \
    PORT=8000 \
    MODEL_DIR=/opt/models \
    DATA_DIR=/data \
    DEVICE=cpu \
    LOG_LEVEL=info

RUN groupadd --gid 10001 translator \
    && useradd --uid 10001 --gid translator --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin translator \
    && mkdir /data /models && chown 10001:10001 /data /models
# Glossaries (a SQLite file): mount a volume here to keep them (compose does).
VOLUME /data
# /models: where compose's and Kubernetes' volume of installed models (translate-models) is
# mounted, owned by the service's user so that a new volume takes that owner.

COPY --from=builder /opt/venv /opt/venv
# The default bundle (models/en-de) and any other bundle in models/: owned by root, read-only.
COPY --from=builder /opt/models /opt/models

USER 10001:10001
WORKDIR /opt
EXPOSE 8000

# Healthy = /ready answers 200 (bundle loaded and warmed up); 503 before, so the check fails.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('PORT', '8000'), timeout=4)"]

ENTRYPOINT ["translate-serve"]
