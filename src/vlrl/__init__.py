"""vlrl: reinforcement-learning post-training for vision-language models."""

import os

# Nothing in vlrl may reach a model hub: models are local directories. Set before transformers
# or huggingface_hub are imported anywhere in the process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"
