"""lr-publish: publish a trained policy to the Hugging Face Hub.

A publish folder holds the weights (model.safetensors, or a LoRA adapter's
adapter_model.safetensors + adapter_config.json), config.json, the processors,
train_config.json and a model card (README.md). It is always written and checked locally
before anything is sent, so a failed push loses nothing and the error says how to retry.
DCP shards, training_state/ and the token are never uploaded.

Entry points:

- `publish_trained_model(model, ...)`: at the end of training, on every rank.
- `publish_checkpoint(step_dir, repo_id)`: a saved checkpoint (`lr-publish --checkpoint_dir=`,
  `lr-checkpoint convert --push_to_hub=`).
- `publish_folder(folder, repo_id)`: a folder built before (`lr-publish --folder=`, the retry).

    >>> from lr_publish import publish_checkpoint
    >>> url = publish_checkpoint("outputs/train/run/checkpoints/last", "me/my_policy")  # doctest: +SKIP

The token comes from `HF_TOKEN` or `hf auth login`. The endpoint comes from the argument,
else `HF_ENDPOINT`, else huggingface.co, and is passed to `HfApi` explicitly. Transient Hub
failures are retried `LR_HUB_RETRIES` times (default 5) from `LR_HUB_RETRY_BASE_S` seconds
(default 2), doubling.
"""

from ._card import model_card
from ._errors import HubPushError, HubUnavailableError, PublishError
from ._folder import check_publish_folder, default_publish_folder
from ._hub import check_publish_settings, resolve_endpoint
from ._publish import build_publish_folder_from_checkpoint, publish_checkpoint, publish_folder
from ._trained import publish_trained_model

__all__ = [
    "HubPushError",
    "HubUnavailableError",
    "PublishError",
    "build_publish_folder_from_checkpoint",
    "check_publish_folder",
    "check_publish_settings",
    "default_publish_folder",
    "model_card",
    "publish_checkpoint",
    "publish_folder",
    "publish_trained_model",
    "resolve_endpoint",
]
