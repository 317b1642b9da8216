# Multi-stage: dependencies are resolved and installed into a virtual environment in the build stage; the
# final image is the slim Python base, that environment without pip, and a non-root user.
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY policies policies
COPY autoscaler autoscaler
RUN /opt/venv/bin/pip install --no-cache-dir . \
 && /opt/venv/bin/pip uninstall -y pip

FROM python:3.11-slim
RUN groupadd --gid 10001 autoscaler \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin autoscaler
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp
USER 10001:10001
EXPOSE 8080 8081 9090
ENTRYPOINT ["autoscaler"]
CMD ["run", "--config", "/etc/inference-autoscaler/config.yaml"]
