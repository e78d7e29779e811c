# The operator image: `localmodel run` (the operator), `localmodel gateway` (the
# slot gate sidecar the operator renders into every model pod), `localmodel probe`,
# and the kubectl plugin's `kubectl-localmodel`.
#
# BASE_IMAGE: any image with Python 3.11 and pip. The default is the public
# python:3.11-slim pinned by the digest of its multi-arch index (renew it with
# `crane digest docker.io/library/python:3.11-slim` or `docker buildx imagetools
# inspect`). The test node builds on a Debian 12 base made from Debian's
# packages instead (hack/build-images.sh passes BASE_IMAGE).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# Build: the operator's wheel and every dependency's, from PyPI.
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Final: the base and the installed wheels; no compiler, no source tree, no wheel
# or pip cache (the wheels are bind-mounted, not copied in). The Kubernetes
# client's asyncio twin (kubernetes/aio, ~60 MB; nothing here imports it) is
# left out.
FROM ${BASE_IMAGE}
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl \
    && python3 -c 'import kubernetes, os, shutil; aio = os.path.join(os.path.dirname(kubernetes.__file__), "aio"); os.path.isdir(aio) and shutil.rmtree(aio)'
# Non-root (the chart adds readOnlyRootFilesystem): the operator and the
# gateway need no privileges and write nothing to the image.
USER 65532:65532
ENTRYPOINT ["localmodel"]
CMD ["--help"]
