"""Policies: the protocol, the registry (`act`, `mlp`) and safetensors save/load."""

from .base import Policy
from .registry import load_pretrained, make_policy, policy_class, save_pretrained

__all__ = ["Policy", "load_pretrained", "make_policy", "policy_class", "save_pretrained"]
