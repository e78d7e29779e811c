# The operator image: `localmodel run` (the operator), `localmodel gateway` (the
# slot gate sidecar the operator renders into every model pod), `localmodel probe`.
FROM docker.io/library/python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM docker.io/library/python:3.11-slim
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl
# Non-root: the operator and the gateway need no privileges.
USER 65532:65532
ENTRYPOINT ["localmodel"]
CMD ["--help"]
