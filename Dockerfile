# Fairway on the official vLLM OpenAI server image: vLLM's own `vllm serve` with Fairway's
# scheduler class. The base tag is the GPU pin of this repository (scripts/setup.sh, the `gpu`
# extra in pyproject.toml); tests/unit/test_dockerfile.py keeps them equal.
#
# Build:  docker build -t vllm-fairway .
# Run:    docker run --gpus all -p 8000:8000 --ipc=host \
#           -v ~/.cache/huggingface:/root/.cache/huggingface \
#           -v "$PWD/my-gpu.json:/profiles/my-gpu.json:ro" -e FAIRWAY_PROFILE=/profiles/my-gpu.json \
#           vllm-fairway meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768
# Everything after the image name goes to `vllm serve` (the model first). Fairway's options:
# FAIRWAY_<KEY> variables (they override --additional-config), or a later --additional-config
# '{"fairway": {...}}' argument, which replaces the default one below. See FAIRWAY.md and
# docs/deployment.md (prefill node, tensor parallel on Ray).
FROM vllm/vllm-openai:v0.34.0

LABEL org.opencontainers.image.title="vllm-fairway" \
      org.opencontainers.image.description="vLLM with Fairway's load- and prefix-cache-aware waiting-queue order" \
      org.opencontainers.image.licenses="Apache-2.0"

WORKDIR /opt/fairway
COPY pyproject.toml README.md ./
COPY fairway ./fairway
# --no-deps: vLLM and everything the scheduler imports (numpy, prometheus_client) are in the
# image already, and a resolver run must not move the image's pinned versions. matplotlib is not
# installed: `fairway profile` inside the container then skips its plot (the table is written).
# The image installs with uv in recent releases and pip in older ones; use what is there.
RUN if command -v uv >/dev/null 2>&1; then \
        uv pip install --system --no-cache --no-deps .; \
    else \
        python3 -m pip install --no-cache-dir --no-deps .; \
    fi \
    && python3 -c "import fairway.policies, fairway.profiling.table, fairway.options; print('fairway ok')"

EXPOSE 8000
# Model loading can take minutes; /health answers once the engine is up. Assumes --port 8000.
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=5)"]

# The profile (the table Fairway's patience comes from) defaults to the shipped analytic RTX A6000
# / Llama-3.1-8B estimate; measure your GPU with `fairway profile` and mount the table with
# FAIRWAY_PROFILE=/path (it overrides the JSON below), or give a whole --additional-config.
# FairwayScheduler follows vLLM's async-scheduling setting (on by default on GPUs: it is then
# FairwayAsyncScheduler), so the image keeps vLLM's default; `--no-async-scheduling` turns it off.
ENTRYPOINT ["vllm", "serve", \
            "--scheduler-cls", "fairway.vllm.scheduler.FairwayScheduler", \
            "--scheduling-policy", "fcfs", \
            "--enable-prefix-caching", \
            "--additional-config", \
            "{\"fairway\": {\"policy\": \"fairway\", \"profile\": \"a6000-llama3.1-8b-estimate\"}}"]
CMD ["--help"]
