# Multi-stage: the controller's dependencies (exact versions from constraints.txt) are installed into a
# virtual environment in the build stage, without the replay extras (plotting) and without the packages'
# own test suites; the final image is the slim Python base, that environment (no pip, no setuptools) and a
# non-root user. `autoscaler replay` works in it too (no plot; output to a temporary folder when the working
# directory is read-only).
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md constraints.txt ./
COPY policies policies
COPY autoscaler autoscaler
RUN /opt/venv/bin/pip install --no-cache-dir --no-compile -c constraints.txt . \
 && /opt/venv/bin/pip uninstall -y setuptools wheel pip \
 && find /opt/venv/lib -depth -type d -name tests -path '*/site-packages/*' -exec rm -rf {} + \
 && /opt/venv/bin/python -m compileall -q -j 0 /opt/venv/lib

FROM python:3.11-slim
RUN groupadd --gid 10001 autoscaler \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin autoscaler
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080 8081 9090
ENTRYPOINT ["autoscaler"]
CMD ["run", "--config", "/etc/inference-autoscaler/config.yaml"]
