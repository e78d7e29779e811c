# The operator image: `localmodel run` (the operator), `localmodel gateway` (the
# slot gate sidecar the operator renders into every model pod), `localmodel probe`.
# BASE_IMAGE: any image with Python 3.11 and pip; the test node builds on a
# Debian 12 base made from Debian's packages (hack/build-images.sh).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${BASE_IMAGE}
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl
# Non-root: the operator and the gateway need no privileges.
USER 65532:65532
ENTRYPOINT ["localmodel"]
CMD ["--help"]
