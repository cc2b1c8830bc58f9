# The operator image: `ftjob operator`, torch-free, non-root.
#
# BASE_IMAGE needs python3 (>= 3.11) with the venv module; scripts/build-images.sh passes a
# Debian bookworm rootfs made by debootstrap, anything like python:3.11-slim works too.
# Three stages. `deps` is a venv with exactly requirements/operator-image.txt (exported from the
# one lock, uv.lock, with hashes, by scripts/lock.sh): scripts/build-images.sh keeps it in
# buildah's store under a hash of its inputs and builds it only when they change. `build` adds the source; the
# last stage copies the venv alone, so pip, its cache and the source tree stay out of the image.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim

FROM ${BASE_IMAGE} AS deps
# A TLS-intercepting proxy's CA can be passed as the secret `ca-bundle`; it never lands in a layer.
RUN --mount=type=secret,id=ca-bundle \
    --mount=type=bind,source=requirements/operator-image.txt,target=/tmp/deps/requirements.txt \
    set -eu; \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \
    python3 -m venv /opt/ftjob; \
    /opt/ftjob/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps --require-hashes \
      --requirement /tmp/deps/requirements.txt

# The source, without dependencies (deps has them; pip check says if the source asks for one it
# lacks) and without build isolation (deps has the build backend).
FROM deps AS build
COPY pyproject.toml README.md /src/
COPY operator /src/operator
RUN set -eu; \
    /opt/ftjob/bin/pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation --no-index /src; \
    if /opt/ftjob/bin/pip check | grep -i '^finetune-operator '; then echo "the deps stage lacks a requirement of the source (above)" >&2; exit 1; fi; \
    /opt/ftjob/bin/pip uninstall --yes --quiet pip setuptools wheel; \
    # kubernetes>=35 bundles an asyncio copy of the client (~70 MB) that neither the operator
    # nor kopf imports; the import check in scripts/build-images.sh guards this.
    rm -rf /opt/ftjob/lib/python3*/site-packages/kubernetes/aio; \
    /opt/ftjob/bin/ftjob --help >/dev/null

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="finetune-operator" \
      org.opencontainers.image.description="Kubernetes operator for distributed LLM fine-tuning with DeepSpeed"
COPY --from=build /opt/ftjob /opt/ftjob
ENV PATH=/opt/ftjob/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so Kubernetes can verify runAsNonRoot without a passwd entry.
USER 1000:1000
EXPOSE 8080 8081
ENTRYPOINT ["ftjob", "operator"]
